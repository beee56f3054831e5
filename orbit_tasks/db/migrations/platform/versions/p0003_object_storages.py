"""S3 locations of archive storages (issue 18): ``orbit_archive_object_storages``.

Builds its table from its own frozen copy (``p0003_tables.py``). Adds a table only: a database
at p0002 upgrades without touching its rows, and workers of the previous release ignore it.

Revision ID: p0003
Revises: p0002
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0003_tables import metadata

revision = "p0003"
down_revision = "p0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
