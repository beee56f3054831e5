"""Initial business schema: the sender outbox seed tables (not part of platform migrations).

Builds its tables from its own frozen copy (``b0001_tables.py``, SPEC §12), never from the live
table module, so that a later change of that module cannot change what this revision created.

Revision ID: b0001
Revises:
"""

from alembic import op

from orbit_tasks.db.migrations.business.b0001_tables import metadata
from orbit_tasks.db.migrations.frozen_0001 import create_statements

revision = "b0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
