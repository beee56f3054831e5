"""Queue holds: ``sender_holds`` (issue 23 item 4).

Builds its table from its own frozen copy (``b0003_tables.py``, SPEC §12); the earlier tables
are not touched.

Revision ID: b0003
Revises: b0002
"""

from alembic import op

from orbit_tasks.db.migrations.business.b0003_tables import metadata
from orbit_tasks.db.migrations.frozen_0001 import create_statements

revision = "b0003"
down_revision = "b0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
