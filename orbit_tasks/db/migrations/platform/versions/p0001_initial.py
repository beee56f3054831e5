"""Initial platform schema: seed archive tables, tenants, volumes, policies, API, history sources.

Builds its tables from its own frozen copy (``p0001_tables.py``, SPEC §12), never from the live
table modules, so that a later change of those modules cannot change what this revision created.

Revision ID: p0001
Revises:
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0001_tables import metadata

revision = "p0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
