"""The platform table of revision p0005, frozen (issue 24 item 4): the final step's progress.

A copy of ``orbit_archive_job_checks`` in ``orbit_tasks/db/platform_tables.py`` as it was when
p0005 was written. Never edit this file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, Table, text

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import (
    ascii_str,
    datetime6,
    hex64,
    id16,
    now6,
    ubigint,
    uint,
)

REVISION = "p0005"

metadata = MetaData()

Table(
    "orbit_archive_job_checks",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("job_id", id16(), nullable=False),
    Column("batches", uint(), nullable=False, comment="the confirmed chain it belongs to"),
    Column("last_sha256", hex64(), nullable=False, comment="the confirmed chain's tail"),
    Column("checked", uint(), nullable=False, comment="files 0..checked-1 re-verified"),
    Column("link", hex64(), nullable=False, comment="SHA-256 of file checked-1"),
    Column("roots", ubigint(), nullable=False, comment="roots of files 0..checked-1"),
    Column("bytes", ubigint(), nullable=False, comment="bytes of files 0..checked-1"),
    Column("last_settled", ascii_str(40), nullable=False, server_default=text("''")),
    Column("last_id", ascii_str(32), nullable=False, server_default=text("''")),
    Column("manifest_sha256", hex64(), nullable=False),
    Column("updated_at", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("namespace_id", "job_id"),
    comment="progress of an archive job's final re-verification, written under its lease",
    **OPTS,
)
