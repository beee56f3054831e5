"""The platform table of revision p0006, frozen (issue 25): the effective ends of job ranges.

A copy of ``orbit_archive_job_ends`` in ``orbit_tasks/db/platform_tables.py`` as it was when
p0006 was written. Never edit this file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, Table

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import datetime6, id16, now6, ubigint

REVISION = "p0006"

metadata = MetaData()

Table(
    "orbit_archive_job_ends",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("job_id", id16(), nullable=False, comment="the job of orbit_archive_jobs"),
    Column("range_until", datetime6(), nullable=False, comment="the end: a settled time"),
    Column("until_id", id16(), nullable=True, comment="with range_until, a key (settled, id)"),
    Column("policy_until", datetime6(), nullable=False, comment="the end the policy gives"),
    Column("roots_total", ubigint(), nullable=False, comment="roots of the range"),
    Column("sample_roots", ubigint(), nullable=False, comment="roots of the size sample"),
    Column("sample_bytes", ubigint(), nullable=False, comment="their bytes, packed as files"),
    Column("recorded_at", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("namespace_id", "job_id"),
    comment="effective ends of archive job ranges (SPEC 5 budget-sized ranges)",
    **OPTS,
)
