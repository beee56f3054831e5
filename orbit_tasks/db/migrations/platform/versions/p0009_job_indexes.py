"""Id indexes of SUCCEEDED archive jobs (issue 28 item 1): ``orbit_archive_job_indexes``.

Builds its table from its own frozen copy (``p0009_tables.py``). Adds a table only: a database
at the previous revision upgrades without touching its rows; its SUCCEEDED jobs have no index
yet, and the tick wakes their indexing (docs/archive-format.md "The id index").

Revision ID: p0009
Revises: p0007
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0009_tables import metadata

revision = "p0009"
down_revision = "p0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
