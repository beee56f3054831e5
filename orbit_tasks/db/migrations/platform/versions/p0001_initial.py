"""Initial platform schema: seed archive tables, tenants, volumes, policies, API, history sources.

Revision 0001 creates the tables as defined in ``orbit_tasks.db.platform_tables`` and
``history_tables`` at this revision. Any later change to those modules must come as a new
revision (and this one must then be frozen to a copy of today's definitions).

Revision ID: p0001
Revises:
"""

from alembic import op
from sqlalchemy.schema import CreateIndex, CreateTable

from orbit_tasks.db import history_tables  # noqa: F401
from orbit_tasks.db.platform_tables import metadata

revision = "p0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # DDL elements (not Table.create) so that online and offline (--sql) render the same.
    for table in metadata.sorted_tables:
        op.execute(CreateTable(table))
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            op.execute(CreateIndex(index))


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
