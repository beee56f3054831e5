"""Every SQL statement of the outbox sender (business database, SQLAlchemy Core).

Ownership of a row is the compare-and-set claim (``state``/``lease_epoch``/``wake_at`` as seen);
every outcome write is fenced by ``lease_epoch = :mine AND state = 'SENDING'``: ``rowcount != 1``
means a newer claim owns the row and the result is dropped.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.engine import Connection

from orbit_tasks.db.business_tables import sender_jobs, sender_outbox
from orbit_tasks.db.engine import is_mysql
from orbit_tasks.sender import policy

o = sender_outbox
j = sender_jobs


@dataclass(frozen=True)
class Candidate:
    namespace_id: str
    queue_id: str
    operation_id: str
    state: str
    lease_epoch: int
    send_count: int
    send_deadline_at: dt.datetime


@dataclass(frozen=True)
class Claimed:
    """A row this sender owns under ``lease_epoch`` until ``lease_until``."""

    namespace_id: str
    queue_id: str
    operation_id: str
    idempotency_key: str
    request_json: str
    request_digest: bytes
    send_count: int
    lease_epoch: int
    claimed_at: dt.datetime
    lease_until: dt.datetime
    send_deadline_at: dt.datetime


# --- enqueue -----------------------------------------------------------------------------------


def get_row(conn: Connection, namespace_id: str, operation_id: str) -> Any:
    return conn.execute(
        select(o).where(o.c.namespace_id == namespace_id, o.c.operation_id == operation_id)
    ).first()


def get_job(conn: Connection, namespace_id: str, operation_id: str) -> Any:
    return conn.execute(
        select(j).where(j.c.namespace_id == namespace_id, j.c.operation_id == operation_id)
    ).first()


def insert_entry(
    conn: Connection,
    *,
    namespace_id: str,
    queue_id: str,
    operation_id: str,
    request_json: str,
    request_digest: bytes,
    source_ref: str,
    now: dt.datetime,
) -> None:
    """The outbox row and its business row, in the caller's transaction."""
    conn.execute(
        insert(j).values(
            namespace_id=namespace_id,
            operation_id=operation_id,
            source_ref=source_ref,
            task_id=None,
            created_at=now,
            updated_at=now,
        )
    )
    conn.execute(
        insert(o).values(
            namespace_id=namespace_id,
            queue_id=queue_id,
            operation_id=operation_id,
            idempotency_key=policy.idempotency_key(operation_id),
            request_json=request_json,
            request_digest=request_digest,
            state="PENDING",
            send_count=0,
            lease_epoch=0,
            wake_at=now,
            send_deadline_at=now + policy.SEND_WINDOW,
            last_code=policy.NEW,
            task_id=None,
            receipt_json=None,
            created_at=now,
            updated_at=now,
        )
    )


# --- relay: scan, guard, claim -----------------------------------------------------------------


def due_candidates(
    conn: Connection, namespace_id: str, queue_id: str, now: dt.datetime, limit: int
) -> list[Candidate]:
    """Due rows of one (namespace, queue) via ``ix_sender_due``: PENDING rows whose wake time
    came and SENDING rows whose lease expired (terminal rows have ``wake_at`` NULL)."""
    stmt = (
        select(
            o.c.namespace_id,
            o.c.queue_id,
            o.c.operation_id,
            o.c.state,
            o.c.lease_epoch,
            o.c.send_count,
            o.c.send_deadline_at,
        )
        .where(o.c.namespace_id == namespace_id, o.c.queue_id == queue_id, o.c.wake_at <= now)
        .order_by(o.c.wake_at, o.c.operation_id)
        .limit(limit)
    )
    if is_mysql(conn):
        # Only a hint to keep concurrent senders apart; the CAS below decides ownership.
        stmt = stmt.with_for_update(skip_locked=True)
    return [Candidate(*row) for row in conn.execute(stmt)]


def _seen(c: Candidate, now: dt.datetime) -> Any:
    return and_(
        o.c.namespace_id == c.namespace_id,
        o.c.operation_id == c.operation_id,
        o.c.state == c.state,
        o.c.lease_epoch == c.lease_epoch,
        o.c.wake_at <= now,
    )


def guard_to_review(conn: Connection, c: Candidate, code: str, now: dt.datetime) -> bool:
    """Move a due row that may not be claimed (deadline, attempts) to REVIEW, as seen."""
    result = conn.execute(
        update(o)
        .where(_seen(c, now))
        .values(state="REVIEW", wake_at=None, last_code=code, updated_at=now)
    )
    return result.rowcount == 1


def claim(conn: Connection, c: Candidate, now: dt.datetime, lease_seconds: int) -> bool:
    """Compare-and-set claim: one more send, a new epoch, SENDING until ``now + lease``."""
    result = conn.execute(
        update(o)
        .where(
            _seen(c, now),
            o.c.send_count < policy.MAX_SENDS,
            o.c.send_deadline_at > now,
        )
        .values(
            send_count=o.c.send_count + 1,
            lease_epoch=o.c.lease_epoch + 1,
            state="SENDING",
            wake_at=now + dt.timedelta(seconds=lease_seconds),
            updated_at=now,
        )
    )
    return result.rowcount == 1


def load_claimed(
    conn: Connection,
    claims: list[tuple[Candidate, int]],
    now: dt.datetime,
    lease_seconds: int,
) -> list[Claimed]:
    """The frozen bodies of rows just claimed (by (namespace, operation), epoch as claimed)."""
    out: list[Claimed] = []
    by_ns: dict[str, list[str]] = {}
    for c, _epoch in claims:
        by_ns.setdefault(c.namespace_id, []).append(c.operation_id)
    epochs = {(c.namespace_id, c.operation_id): e for c, e in claims}
    for ns, ops in by_ns.items():
        rows = conn.execute(
            select(
                o.c.namespace_id,
                o.c.queue_id,
                o.c.operation_id,
                o.c.idempotency_key,
                o.c.request_json,
                o.c.request_digest,
                o.c.send_count,
                o.c.lease_epoch,
                o.c.send_deadline_at,
            ).where(o.c.namespace_id == ns, o.c.operation_id.in_(ops))
        )
        for r in rows:
            if r.lease_epoch != epochs[(r.namespace_id, r.operation_id)]:
                continue  # taken over already (cannot happen inside the lease; be strict)
            out.append(
                Claimed(
                    namespace_id=r.namespace_id,
                    queue_id=r.queue_id,
                    operation_id=r.operation_id,
                    idempotency_key=r.idempotency_key,
                    request_json=r.request_json,
                    request_digest=bytes(r.request_digest),
                    send_count=r.send_count,
                    lease_epoch=r.lease_epoch,
                    claimed_at=now,
                    lease_until=now + dt.timedelta(seconds=lease_seconds),
                    send_deadline_at=r.send_deadline_at,
                )
            )
    return out


# --- fenced outcome writes ---------------------------------------------------------------------


def _mine(row: Claimed) -> Any:
    return and_(
        o.c.namespace_id == row.namespace_id,
        o.c.operation_id == row.operation_id,
        o.c.lease_epoch == row.lease_epoch,
        o.c.state == "SENDING",
    )


def write_accepted(
    conn: Connection, row: Claimed, task_id: str, receipt_json: str, now: dt.datetime
) -> bool:
    """ACCEPTED with the original receipt, and ``sender_jobs.task_id`` in the same transaction."""
    result = conn.execute(
        update(o)
        .where(_mine(row))
        .values(
            state="ACCEPTED",
            wake_at=None,
            last_code=policy.ACCEPTED,
            task_id=task_id,
            receipt_json=receipt_json,
            updated_at=now,
        )
    )
    if result.rowcount != 1:
        return False
    conn.execute(
        update(j)
        .where(j.c.namespace_id == row.namespace_id, j.c.operation_id == row.operation_id)
        .values(task_id=task_id, updated_at=now)
    )
    return True


def write_retry(
    conn: Connection, row: Claimed, code: str, wake_at: dt.datetime, now: dt.datetime
) -> bool:
    assert code in policy.RETRY_CODES
    result = conn.execute(
        update(o)
        .where(_mine(row))
        .values(state="PENDING", wake_at=wake_at, last_code=code, updated_at=now)
    )
    return result.rowcount == 1


def write_review(conn: Connection, row: Claimed, code: str, now: dt.datetime) -> bool:
    assert code in policy.REVIEW_CODES
    result = conn.execute(
        update(o)
        .where(_mine(row))
        .values(state="REVIEW", wake_at=None, last_code=code, updated_at=now)
    )
    return result.rowcount == 1


def release(conn: Connection, row: Claimed, now: dt.datetime) -> bool:
    """Give an unsent claim back (PENDING, due now, ``last_code`` unchanged)."""
    result = conn.execute(
        update(o).where(_mine(row)).values(state="PENDING", wake_at=now, updated_at=now)
    )
    return result.rowcount == 1


# --- deadline sweep ----------------------------------------------------------------------------


def namespace_queues(conn: Connection, namespace_id: str) -> list[str]:
    """Distinct queues with outbox rows in one namespace (a loose scan of ``ix_sender_due``)."""
    rows = conn.execute(
        select(o.c.queue_id)
        .where(o.c.namespace_id == namespace_id)
        .group_by(o.c.queue_id)
        .order_by(o.c.queue_id)
    )
    return [r[0] for r in rows]


def outbox_queues(conn: Connection) -> list[tuple[str, str]]:
    """Distinct (namespace, queue) pairs (a loose scan of ``ix_sender_due``'s prefix)."""
    rows = conn.execute(
        select(o.c.namespace_id, o.c.queue_id)
        .group_by(o.c.namespace_id, o.c.queue_id)
        .order_by(o.c.namespace_id, o.c.queue_id)
    )
    return [(r[0], r[1]) for r in rows]


def sweep_deadlines(conn: Connection, now: dt.datetime, limit: int) -> int:
    """PENDING rows and expired SENDING leases past their deadline -> REVIEW DEADLINE_EXCEEDED,
    across every namespace and queue (also those no sender can claim). A SENDING row inside its
    lease is left to its sender (it was claimed before the deadline)."""
    moved = 0
    for ns, queue in outbox_queues(conn):
        if moved >= limit:
            break
        rows = conn.execute(
            select(o.c.operation_id, o.c.state, o.c.lease_epoch)
            .where(
                o.c.namespace_id == ns,
                o.c.queue_id == queue,
                o.c.wake_at <= now,
                o.c.send_deadline_at <= now,
            )
            .order_by(o.c.wake_at, o.c.operation_id)
            .limit(limit - moved)
        ).all()
        for op, state, epoch in rows:
            result = conn.execute(
                update(o)
                .where(
                    o.c.namespace_id == ns,
                    o.c.operation_id == op,
                    o.c.state == state,
                    o.c.lease_epoch == epoch,
                    o.c.wake_at <= now,
                    o.c.send_deadline_at <= now,
                )
                .values(
                    state="REVIEW",
                    wake_at=None,
                    last_code=policy.DEADLINE_EXCEEDED,
                    updated_at=now,
                )
            )
            moved += result.rowcount
    return moved


# --- operators ---------------------------------------------------------------------------------

LIST_COLUMNS = (
    "namespace_id",
    "operation_id",
    "queue_id",
    "state",
    "last_code",
    "send_count",
    "wake_at",
    "send_deadline_at",
    "task_id",
    "updated_at",
)


def list_rows(
    conn: Connection,
    *,
    state: str | None,
    namespace_id: str | None,
    limit: int,
    after: tuple[str, str] | None,
) -> list[dict[str, Any]]:
    """Rows in (namespace, operation) order, keyset-paginated after ``after``."""
    stmt = select(*(o.c[name] for name in LIST_COLUMNS))
    if state is not None:
        stmt = stmt.where(o.c.state == state)
    if namespace_id is not None:
        stmt = stmt.where(o.c.namespace_id == namespace_id)
    if after is not None:
        stmt = stmt.where(
            or_(
                o.c.namespace_id > after[0],
                and_(o.c.namespace_id == after[0], o.c.operation_id > after[1]),
            )
        )
    stmt = stmt.order_by(o.c.namespace_id, o.c.operation_id).limit(limit)
    return [dict(r._mapping) for r in conn.execute(stmt)]


def count_by_state(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(o.c.state, func.count()).group_by(o.c.state))
    return {r[0]: int(r[1]) for r in rows}


def requeue(conn: Connection, row: Any, now: dt.datetime) -> bool:
    """REVIEW -> PENDING, same key and body, due now; compare-and-set on what was read."""
    result = conn.execute(
        update(o)
        .where(
            o.c.namespace_id == row.namespace_id,
            o.c.operation_id == row.operation_id,
            o.c.state == "REVIEW",
            o.c.lease_epoch == row.lease_epoch,
            o.c.send_count < policy.MAX_SENDS,
            o.c.send_deadline_at > now,
        )
        .values(state="PENDING", wake_at=now, updated_at=now)
    )
    return result.rowcount == 1
