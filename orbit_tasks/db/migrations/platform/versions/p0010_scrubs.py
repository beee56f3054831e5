"""The scheduled scrub (issue 28 item 3): ``orbit_archive_scrubs`` and
``orbit_archive_scrub_leases``.

Builds its tables from its own frozen copy (``p0010_tables.py``). Adds tables only: a database at
the previous revision upgrades without touching its rows; its SUCCEEDED jobs count as verified
when they succeeded (the runner's final step re-verified the whole chain) until their first scrub.

Revision ID: p0010
Revises: p0009
"""

from alembic import op

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform.p0010_tables import metadata

revision = "p0010"
down_revision = "p0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
