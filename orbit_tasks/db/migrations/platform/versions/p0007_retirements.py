"""Retired storages and namespaces (issue 27): ``orbit_retirements``.

Builds its table from its own frozen copy (``p0007_tables.py``). Adds a table only: a database
at the previous revision upgrades without touching its rows; nothing is retired then.

Revision ID: p0007
Revises: p0006
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0007_tables import metadata

revision = "p0007"
down_revision = "p0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
