"""Effective ends of archive job ranges (issue 25): ``orbit_archive_job_ends``.

Builds its table from its own frozen copy (``p0006_tables.py``). Adds a table only: a database
at the previous revision upgrades without touching its rows; its jobs have no recorded end, and
their range ends where their policy says (SPEC §5).

Revision ID: p0006
Revises: p0005
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0006_tables import metadata

revision = "p0006"
down_revision = "p0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
