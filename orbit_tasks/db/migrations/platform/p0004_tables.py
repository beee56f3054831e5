"""The platform table of revision p0004, frozen (issue 24): ``orbit_archive_job_waits`` whose
``ck_archive_wait_reason`` accepts ``replica_diverged``.

A copy of the table in ``orbit_tasks/db/platform_tables.py`` as it was when p0004 was written
(p0002's copy with one more reason). Never edit this file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, MetaData, PrimaryKeyConstraint, Table, text

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import datetime6, id16, now6, ubigint, varchar

REVISION = "p0004"

#: The CHECK of the reasons, as p0004 writes it (p0002's list and ``replica_diverged``).
WAIT_REASONS = (
    "reason IN ('paused','throttled','db_load','replica_lag','window','replica_diverged')"
)

metadata = MetaData()

Table(
    "orbit_archive_job_waits",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("job_id", id16(), nullable=False),
    Column("reason", varchar(16), nullable=False),
    Column("since", datetime6(), nullable=True, comment="start of the open wait, NULL = none"),
    Column(
        "waited_us",
        ubigint(),
        nullable=False,
        server_default=text("0"),
        comment="microseconds of the closed waits",
    ),
    Column("updated_at", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("namespace_id", "job_id", "reason"),
    CheckConstraint(WAIT_REASONS, name="ck_archive_wait_reason"),
    comment="seconds an archive job waited before a claim, by reason",
    **OPTS,
)
