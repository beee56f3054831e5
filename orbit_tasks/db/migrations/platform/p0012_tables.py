"""The platform table of revision p0012, frozen (issue 30 item 3): the beat leader's lease.

A copy of ``orbit_beat_leaders`` in ``orbit_tasks/db/platform_tables.py`` as it was when p0012
was written. Never edit this file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, Table

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import ascii_str, datetime6, id16, ubigint

REVISION = "p0012"

metadata = MetaData()

Table(
    "orbit_beat_leaders",
    metadata,
    Column("name", ascii_str(64), nullable=False, comment="the schedule led: always 'beat'"),
    Column("holder", ascii_str(255), nullable=False, comment="host:pid of the leader"),
    Column("lease_id", id16(), nullable=False, comment="random per beat process"),
    Column("epoch", ubigint(), nullable=False, comment="+1 at every change of leader"),
    Column("lease_until", datetime6(), nullable=False, comment="database clock"),
    Column("acquired_at", datetime6(), nullable=False, comment="when this leader took over"),
    Column("last_tick_at", datetime6(), nullable=True, comment="last tick the leader sent"),
    PrimaryKeyConstraint("name"),
    comment="the beat leader's lease (one row per schedule)",
    **OPTS,
)
