"""The platform table of revision p0003, frozen (issue 18): S3 locations of archive storages.

A copy of ``orbit_archive_object_storages`` in ``orbit_tasks/db/platform_tables.py`` as it was
when p0003 was written. Never edit this file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import Column, Index, MetaData, PrimaryKeyConstraint, Table, false, text

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import boolean, datetime6, id16, now6, varchar

REVISION = "p0003"

metadata = MetaData()

Table(
    "orbit_archive_object_storages",
    metadata,
    Column("storage_id", id16(), nullable=False, comment="the storage of orbit_archive_storages"),
    Column("bucket", varchar(63), nullable=False),
    Column("prefix", varchar(512), nullable=False, server_default=text("''")),
    Column("endpoint", varchar(255), nullable=False, server_default=text("''")),
    Column("region", varchar(64), nullable=False, server_default=text("''")),
    Column("path_style", boolean(), nullable=False, server_default=false()),
    Column("storage_class", varchar(32), nullable=False, server_default=text("''")),
    Column("sse", varchar(16), nullable=False, server_default=text("''")),
    Column("kms_key_id", varchar(255), nullable=False, server_default=text("''")),
    Column("created_at", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("storage_id"),
    Index("ix_archive_object_storage_bucket", "bucket"),
    comment="S3 locations of archive storages: bucket, prefix, endpoint and write options",
    **OPTS,
)
