"""The platform table of revision p0004, frozen (issue 24): ``orbit_archive_job_waits`` whose
``ck_archive_wait_reason`` accepts ``replica_diverged``.

p0002's frozen table (itself never edited) with that one CHECK replaced: the table as p0004
leaves it. Never edit this file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, MetaData, Table

from orbit_tasks.db.migrations.platform import p0002_tables

REVISION = "p0004"

#: The CHECK of the reasons, as p0004 writes it (p0002's list and ``replica_diverged``).
WAIT_REASONS = (
    "reason IN ('paused','throttled','db_load','replica_lag','window','replica_diverged')"
)
CHECK = "ck_archive_wait_reason"

metadata = MetaData()

_waits: Table = p0002_tables.metadata.tables["orbit_archive_job_waits"].to_metadata(metadata)
_waits.constraints.remove(next(c for c in _waits.constraints if c.name == CHECK))
_waits.append_constraint(CheckConstraint(WAIT_REASONS, name=CHECK))
