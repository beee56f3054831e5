"""The platform table of revision p0007, frozen (issue 27): retired storages and namespaces.

A copy of ``orbit_retirements`` in ``orbit_tasks/db/platform_tables.py`` as it was when p0007
was written. Never edit this file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, MetaData, PrimaryKeyConstraint, Table

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import datetime6, id16, now6, varchar

REVISION = "p0007"

metadata = MetaData()

Table(
    "orbit_retirements",
    metadata,
    Column("target_kind", varchar(16), nullable=False, comment="storage or namespace"),
    Column("target_id", id16(), nullable=False, comment="the storage's or namespace's id"),
    Column("reason", varchar(500), nullable=False, comment="why, one line"),
    Column("retired_by", varchar(128), nullable=False, comment="the operator"),
    Column("retired_at", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("target_kind", "target_id"),
    CheckConstraint("target_kind IN ('storage','namespace')", name="ck_retirement_kind"),
    comment="retired archive storages and namespaces: out of lists and gauges, no new work",
    **OPTS,
)
