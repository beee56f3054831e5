"""The beat leader's lease (issue 30 item 3): ``orbit_beat_leaders``.

Builds its table from its own frozen copy (``p0012_tables.py``). Adds a table only: a database
at the previous revision upgrades without touching its rows; the first beat that starts after
the upgrade creates the one row and leads.

Revision ID: p0012
Revises: p0007
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0012_tables import metadata

revision = "p0012"
down_revision = "p0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
