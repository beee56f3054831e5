"""The operator console (issue 29): ``orbit_console_users`` and ``orbit_console_sessions``.

Builds its tables from its own frozen copy (``p0011_tables.py``). Adds tables only: a database
at the previous revision upgrades without touching its rows; the console has no user until
``orbit console user add`` makes one.

Revision ID: p0011
Revises: p0010
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0011_tables import metadata

revision = "p0011"
down_revision = "p0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
