"""Retention and resolutions: ``sender_pruned`` and ``sender_resolutions`` (issue 17).

Builds its tables from its own frozen copy (``b0002_tables.py``, SPEC §12); the seed tables
``sender_outbox`` and ``sender_jobs`` are not touched.

Revision ID: b0002
Revises: b0001
"""

from alembic import op

from orbit_tasks.db.migrations.business.b0002_tables import metadata
from orbit_tasks.db.migrations.frozen_0001 import create_statements

revision = "b0002"
down_revision = "b0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in create_statements(metadata):
        op.execute(statement)


def downgrade() -> None:
    for table in reversed(metadata.sorted_tables):
        op.drop_table(table.name)
