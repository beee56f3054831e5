"""The platform tables of revision p0002, frozen (SPEC §12): the archive controls (issue 16).

Pauses, throttles and run windows per scope (``orbit_archive_controls``), the generation that
every control change bumps (``orbit_archive_control_generation``: a running claim's confirm
compares it, docs/archive-controls.md), the shared token buckets of throttles
(``orbit_archive_throttle_buckets``), the seconds each job waited by reason
(``orbit_archive_job_waits``) and the primary's heartbeat row that a replica's apply position is
measured by (``orbit_archive_heartbeat``). Built with the frozen types of revision 0001. Never
edit this file; a schema change is a new revision. The seed tables are not touched.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    text,
)

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

REVISION = "p0002"

metadata = MetaData()

Table(
    "orbit_archive_controls",
    metadata,
    Column("control", varchar(16), nullable=False, comment="pause, throttle or window"),
    Column(
        "scope",
        ascii_str(96),
        nullable=False,
        comment="canonical scope key storage/namespace/kind, * for any",
    ),
    Column("storage_id", id16(), nullable=True, comment="NULL = every storage"),
    Column("namespace_id", id16(), nullable=True, comment="NULL = every namespace"),
    Column("kind", varchar(16), nullable=True, comment="NULL = every kind"),
    Column("max_roots_per_second", uint(), nullable=True, comment="throttle only"),
    Column(
        "windows",
        ascii_str(255),
        nullable=False,
        server_default=text("''"),
        comment="window only: HH:MM-HH:MM[,...] UTC",
    ),
    Column("reason", varchar(255), nullable=False, server_default=text("''")),
    Column("actor", varchar(128), nullable=False),
    Column("since", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("control", "scope"),
    CheckConstraint("control IN ('pause','throttle','window')", name="ck_archive_control_kind"),
    comment="operator controls of archive jobs: pauses, throttles, run windows",
    **OPTS,
)

Table(
    "orbit_archive_control_generation",
    metadata,
    Column("id", SmallInteger(), nullable=False, autoincrement=False, comment="always 1"),
    Column("generation", ubigint(), nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("id"),
    comment="bumped by every control change; a missing row reads as 0",
    **OPTS,
)

Table(
    "orbit_archive_throttle_buckets",
    metadata,
    Column("scope", ascii_str(96), nullable=False, comment="the throttle's scope key"),
    Column(
        "ready_at",
        datetime6(),
        nullable=False,
        comment="database time when the roots taken so far are paid for",
    ),
    PrimaryKeyConstraint("scope"),
    comment="shared rate budget of a throttle, taken by compare-and-set",
    **OPTS,
)

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
    CheckConstraint(
        "reason IN ('paused','throttled','db_load','replica_lag','window')",
        name="ck_archive_wait_reason",
    ),
    comment="seconds an archive job waited before a claim, by reason",
    **OPTS,
)

Table(
    "orbit_archive_heartbeat",
    metadata,
    Column("id", SmallInteger(), nullable=False, autoincrement=False, comment="always 1"),
    Column("beat_at", datetime6(), nullable=False, comment="primary clock at the last beat"),
    PrimaryKeyConstraint("id"),
    comment="written by the tick on the primary, read back on a replica",
    **OPTS,
)
