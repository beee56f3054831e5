"""Every SQL statement of the scheduled scrub (issue 28 item 3): the jobs due on a storage, the
one lease per storage that decides who scrubs it (a compare-and-set, never the broker), and the
latest result of each job (``orbit_archive_scrubs``), written under that lease.

Rows come back as frozen values; the decisions (what is due, the read rate) are in
``archive/scrubs.py``, the reads of the files in ``engine/scrub.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, case, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.scrubs import ScrubOutcome
from orbit_tasks.db.engine import Clock
from orbit_tasks.db.platform_tables import archive_jobs as J
from orbit_tasks.db.platform_tables import archive_scrub_leases as L
from orbit_tasks.db.platform_tables import archive_scrubs as S
from orbit_tasks.platform.store import insert_audit


@dataclass(frozen=True)
class ScrubRow:
    """The latest scrub of a job (a row of ``orbit_archive_scrubs``)."""

    namespace_id: bytes
    job_id: bytes
    storage_id: bytes
    checked_at: datetime
    outcome: ScrubOutcome
    verified_at: datetime | None
    first_bad_file: str
    reason: str
    files_read: int
    bytes_read: int
    read_ms: int
    failures: int
    range_from: datetime | None
    from_id: bytes | None
    range_until: datetime | None
    until_id: bytes | None

    @classmethod
    def from_row(cls, row: Any) -> ScrubRow:
        m = row._mapping
        return cls(
            namespace_id=bytes(m["namespace_id"]), job_id=bytes(m["job_id"]),
            storage_id=bytes(m["storage_id"]), checked_at=m["checked_at"],
            outcome=ScrubOutcome(m["outcome"]), verified_at=m["verified_at"],
            first_bad_file=str(m["first_bad_file"]), reason=str(m["reason"]),
            files_read=int(m["files_read"]), bytes_read=int(m["bytes_read"]),
            read_ms=int(m["read_ms"]), failures=int(m["failures"]),
            range_from=m["range_from"], from_id=_opt(m["from_id"]),
            range_until=m["range_until"], until_id=_opt(m["until_id"]),
        )  # fmt: skip


def _opt(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


@dataclass(frozen=True)
class ScrubWrite:
    """What one scrub of a job found, to record."""

    job: Job
    outcome: ScrubOutcome
    first_bad_file: str
    reason: str
    files_read: int
    bytes_read: int
    read_ms: int
    range_from: datetime | None = None
    from_id: bytes | None = None
    range_until: datetime | None = None
    until_id: bytes | None = None


def last_verified_sql() -> Any:
    """When each job last verified: its latest verifying scrub, else its success time
    (``archive.scrubs.last_verified`` in SQL; with ``orbit_archive_scrubs`` left-joined)."""
    return case((S.c.verified_at.is_not(None), S.c.verified_at), else_=J.c.updated_at)


def _joined() -> Any:
    on = and_(S.c.namespace_id == J.c.namespace_id, S.c.job_id == J.c.id)
    return J.outerjoin(S, on)


def due_query(
    storage_id: bytes,
    before: datetime,
    limit: int,
    namespace_id: bytes | None = None,
    *,
    ordered: bool = True,
) -> Any:
    """The SUCCEEDED jobs of a storage last verified at or before ``before``, oldest
    verification first. A verification never precedes the success, so ``updated_at <= before``
    holds for every one of them: the range of ``ix_archive_job_claim`` (storage, state,
    lease_until NULL, updated_at) the scan reads."""
    last = last_verified_sql()
    q = (
        select(J, last.label("last_verified"))
        .select_from(_joined())
        .where(
            J.c.storage_id == storage_id,
            J.c.state == JobState.SUCCEEDED.value,
            J.c.lease_until.is_(None),
            J.c.updated_at <= before,
            last <= before,
        )
    )
    if namespace_id is not None:
        q = q.where(J.c.namespace_id == namespace_id)
    if ordered:
        q = q.order_by(last, J.c.namespace_id, J.c.id)
    return q.limit(limit)


def due_jobs(
    conn: Connection,
    storage_id: bytes,
    before: datetime,
    limit: int,
    namespace_id: bytes | None = None,
) -> list[Job]:
    rows = conn.execute(due_query(storage_id, before, limit, namespace_id)).all()
    return [Job.from_row(r) for r in rows]


def any_due(conn: Connection, storage_id: bytes, before: datetime) -> bool:
    """Whether a job of the storage is due (the tick's question: the first row found, no sort)."""
    return bool(conn.execute(due_query(storage_id, before, 1, ordered=False)).first())


def get_scrub(conn: Connection, ns_id: bytes, job_id: bytes) -> ScrubRow | None:
    row = conn.execute(select(S).where(S.c.namespace_id == ns_id, S.c.job_id == job_id)).first()
    return None if row is None else ScrubRow.from_row(row)


# --- the lease of a storage ----------------------------------------------------------------------


def take_lease(
    conn: Connection, storage_id: bytes, lease_id: bytes, seconds: int, holder: str, clock: Clock
) -> bool:
    """Take the storage's scrub lease when nobody holds it or its holder's lease expired
    (``lease_until < now``, strictly): one compare-and-set; the first scrub of a storage inserts
    the row (a concurrent insert loses on the primary key). True: the lease is ours."""
    free = or_(L.c.lease_id.is_(None), L.c.lease_until < clock.sql())
    with conn.begin():
        done = conn.execute(
            update(L)
            .where(L.c.storage_id == storage_id, free)
            .values(
                lease_id=lease_id,
                lease_until=clock.sql(seconds),
                holder=holder[:255],
                updated_at=clock.sql(),
            )  # fmt: skip
        )
        if done.rowcount == 1:
            return True
        exists = conn.execute(select(L.c.storage_id).where(L.c.storage_id == storage_id)).first()
        if exists is not None:
            return False
    try:
        with conn.begin():
            conn.execute(
                insert(L).values(
                    storage_id=storage_id,
                    lease_id=lease_id,
                    lease_until=clock.sql(seconds),
                    holder=holder[:255],
                    updated_at=clock.sql(),
                )  # fmt: skip
            )
    except IntegrityError:
        return False  # another scrub inserted it first: it holds the lease
    return True


def _mine(storage_id: bytes, lease_id: bytes, clock: Clock) -> list[Any]:
    return [L.c.storage_id == storage_id, L.c.lease_id == lease_id, L.c.lease_until >= clock.sql()]


def renew_lease(
    conn: Connection, storage_id: bytes, lease_id: bytes, seconds: int, clock: Clock
) -> bool:
    """Extend our lease (False: it expired and was taken, or released)."""
    with conn.begin():
        done = conn.execute(
            update(L)
            .where(*_mine(storage_id, lease_id, clock))
            .values(lease_until=clock.sql(seconds), updated_at=clock.sql())
        )
    return done.rowcount == 1


def release_lease(conn: Connection, storage_id: bytes, lease_id: bytes, clock: Clock) -> None:
    """Give the storage back (a lease already taken by another scrub stays theirs)."""
    with conn.begin():
        conn.execute(
            update(L)
            .where(L.c.storage_id == storage_id, L.c.lease_id == lease_id)
            .values(lease_id=None, lease_until=None, updated_at=clock.sql())
        )


def lease_holder(conn: Connection, storage_id: bytes, clock: Clock) -> tuple[str, datetime] | None:
    """Who holds the storage's lease now, and until when (None: nobody)."""
    row = conn.execute(
        select(L.c.holder, L.c.lease_until).where(
            L.c.storage_id == storage_id, L.c.lease_id.is_not(None), L.c.lease_until >= clock.sql()
        )
    ).first()
    return None if row is None else (str(row.holder), row.lease_until)


# --- results -------------------------------------------------------------------------------------


class ScrubLeaseLost(Exception):
    """The storage's lease is no longer ours: the result was not recorded."""


def record(
    conn: Connection,
    lease: tuple[bytes, bytes],
    w: ScrubWrite,
    *,
    seconds: int,
    actor: str,
    clock: Clock,
) -> datetime:
    """Record the latest scrub of ``w.job`` under the storage's lease ``lease`` (storage id,
    lease id), renewed in the same transaction (its row lock keeps another scrub out until the
    commit); a result that did not verify also writes its audit row
    (``archive.job.scrub_failed``). Returns the time recorded. Raises :class:`ScrubLeaseLost`."""
    storage_id, lease_id = lease
    job = w.job
    with conn.begin():
        held = conn.execute(
            update(L)
            .where(*_mine(storage_id, lease_id, clock))
            .values(lease_until=clock.sql(seconds), updated_at=clock.sql())
        )
        if held.rowcount != 1:
            raise ScrubLeaseLost(f"storage {storage_id.hex()}: scrub lease lost")
        now = clock.now(conn)
        good = w.outcome is not ScrubOutcome.BAD
        values: dict[str, Any] = dict(
            storage_id=job.storage_id, checked_at=now, outcome=w.outcome.value,
            first_bad_file=w.first_bad_file[:300], reason=w.reason[:255],
            files_read=w.files_read, bytes_read=w.bytes_read, read_ms=w.read_ms,
        )  # fmt: skip
        if good:
            values.update(
                verified_at=now, range_from=w.range_from, from_id=w.from_id,
                range_until=w.range_until, until_id=w.until_id,
            )  # fmt: skip
        key = and_(S.c.namespace_id == job.namespace_id, S.c.job_id == job.id)
        changed = conn.execute(
            update(S).where(key).values(failures=S.c.failures + (0 if good else 1), **values)
        )
        if changed.rowcount == 0:
            if not good:
                values.update(verified_at=None)
            conn.execute(
                insert(S).values(
                    namespace_id=job.namespace_id,
                    job_id=job.id,
                    failures=0 if good else 1,
                    **values,
                )  # fmt: skip
            )
        if not good:
            insert_audit(
                conn, job.namespace_id, actor=actor, action="archive.job.scrub_failed",
                target_kind="archive_job", target_id=job.id.hex(),
                detail={
                    "storage_id": job.storage_id.hex(), "first_bad_file": w.first_bad_file,
                    "reason": w.reason, "bytes_read": w.bytes_read,
                },
                at=now,
            )  # fmt: skip
    return now
