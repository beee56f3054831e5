"""The platform tables of revision p0010, frozen (issue 28 item 3): the scheduled scrub.

A copy of ``orbit_archive_scrubs`` and ``orbit_archive_scrub_leases`` in
``orbit_tasks/db/platform_tables.py`` as they were when p0010 was written. Never edit this file;
a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, Index, MetaData, PrimaryKeyConstraint, Table, text

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import (
    ascii_str,
    datetime6,
    id16,
    now6,
    ubigint,
    uint,
    varchar,
)

REVISION = "p0010"

metadata = MetaData()

Table(
    "orbit_archive_scrubs",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("job_id", id16(), nullable=False, comment="the job of orbit_archive_jobs"),
    Column("storage_id", id16(), nullable=False, comment="the storage the files were read from"),
    Column("checked_at", datetime6(), nullable=False, comment="the latest scrub ended"),
    Column("outcome", ascii_str(16), nullable=False, comment="ok, bad or repaired"),
    Column("verified_at", datetime6(), nullable=True, comment="the latest scrub that verified"),
    Column("first_bad_file", varchar(300), nullable=False, server_default=text("''")),
    Column("reason", varchar(255), nullable=False, server_default=text("''")),
    Column("files_read", uint(), nullable=False, comment="files read by the latest scrub"),
    Column("bytes_read", ubigint(), nullable=False, comment="bytes read by the latest scrub"),
    Column("read_ms", ubigint(), nullable=False, comment="its duration, sleeps included"),
    Column("failures", uint(), nullable=False, comment="scrubs of the job that did not verify"),
    Column("range_from", datetime6(), nullable=True, comment="the verified manifest's range"),
    Column("from_id", id16(), nullable=True),
    Column("range_until", datetime6(), nullable=True),
    Column("until_id", id16(), nullable=True),
    PrimaryKeyConstraint("namespace_id", "job_id"),
    Index("ix_archive_scrub_storage", "storage_id", "verified_at"),
    CheckConstraint("outcome IN ('ok','bad','repaired')", name="ck_archive_scrub_outcome"),
    comment="latest scrub of each archive job (issue 28): its outcome and what it read",
    **OPTS,
)

Table(
    "orbit_archive_scrub_leases",
    metadata,
    Column("storage_id", id16(), nullable=False),
    Column("lease_id", id16(), nullable=True, comment="the scrub holding the storage, or none"),
    Column("lease_until", datetime6(), nullable=True),
    Column("holder", varchar(255), nullable=False, server_default=text("''")),
    Column("updated_at", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("storage_id"),
    comment="one scrub at a time per storage (issue 28): its bounded read rate holds",
    **OPTS,
)
