"""Archive controls: pauses, throttles, run windows, job waits, the replica heartbeat (issue 16).

Builds its tables from its own frozen copy (``p0002_tables.py``, SPEC §12), never from the live
table modules. Creates new tables only; the seed tables are not touched.

Revision ID: p0002
Revises: p0001
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0002_tables import metadata

revision = "p0002"
down_revision = "p0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
