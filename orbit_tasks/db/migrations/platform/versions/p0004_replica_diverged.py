"""The wait reason ``replica_diverged`` (issue 24): ``ck_archive_wait_reason`` of
``orbit_archive_job_waits`` accepts it.

MySQL/MariaDB replace the CHECK in place (one ``ALTER TABLE``, no row rewritten); SQLite cannot
alter a CHECK, so the table is rebuilt from its frozen copy (``p0004_tables.py``) and its rows
copied. Workers of the previous release never write the new reason, so they run on it unchanged.
The downgrade removes the rows of the new reason (seconds waited, statistics only) first.

Revision ID: p0004
Revises: p0003
"""

from alembic import op
from sqlalchemy import MetaData, Table

from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform import p0002_tables, p0004_tables

revision = "p0004"
down_revision = "p0003"
branch_labels = None
depends_on = None

TABLE = "orbit_archive_job_waits"
CHECK = "ck_archive_wait_reason"


def _replace(source: MetaData) -> None:
    table: Table = source.tables[TABLE]
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_old")
        one = MetaData()
        table.to_metadata(one)
        for statement in create_statements(one):
            op.execute(statement)
        columns = ", ".join(c.name for c in table.columns)
        op.execute(f"INSERT INTO {TABLE} ({columns}) SELECT {columns} FROM {TABLE}_old")
        op.execute(f"DROP TABLE {TABLE}_old")
        return
    check = next(c for c in table.constraints if c.name == CHECK)
    op.execute(
        f"ALTER TABLE {TABLE} DROP CONSTRAINT {CHECK}, "
        f"ADD CONSTRAINT {CHECK} CHECK ({check.sqltext})"  # type: ignore[attr-defined]
    )


def upgrade() -> None:
    _replace(p0004_tables.metadata)


def downgrade() -> None:
    op.execute(f"DELETE FROM {TABLE} WHERE reason = 'replica_diverged'")
    _replace(p0002_tables.metadata)
