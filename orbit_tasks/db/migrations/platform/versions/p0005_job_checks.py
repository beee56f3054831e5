"""The progress of a job's final re-verification (issue 24 item 4): ``orbit_archive_job_checks``.

Builds its table from its own frozen copy (``p0005_tables.py``). Adds a table only: a database
at the previous revision upgrades without touching its rows, and workers of the previous release
ignore it (their final step verifies in one claim, as before).

Revision ID: p0005
Revises: p0004
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0005_tables import metadata

revision = "p0005"
down_revision = "p0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
