"""The platform table of revision p0009, frozen (issue 28 item 1): the id indexes of jobs.

A copy of ``orbit_archive_job_indexes`` in ``orbit_tasks/db/platform_tables.py`` as it was when
p0009 was written. Never edit this file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, Table

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import datetime6, hex64, id16, now6, ubigint, uint

REVISION = "p0009"

metadata = MetaData()

Table(
    "orbit_archive_job_indexes",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("job_id", id16(), nullable=False, comment="the SUCCEEDED job of orbit_archive_jobs"),
    Column("index_sha256", hex64(), nullable=False, comment="SHA-256 of index-<sha256>.json"),
    Column("last_sha256", hex64(), nullable=False, comment="the chain's tail it indexes"),
    Column("batches", uint(), nullable=False, comment="batch files it lists"),
    Column("roots", ubigint(), nullable=False, comment="root ids it holds"),
    Column("shards", uint(), nullable=False, comment="shard files it lists"),
    Column("built_at", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("namespace_id", "job_id"),
    comment="id indexes of SUCCEEDED archive jobs (orbit archive find), written once",
    **OPTS,
)
