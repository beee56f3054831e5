"""The relay's scan, guard and claim of due outbox rows: compare-and-set on the row as seen
(``state``, ``lease_epoch``, ``wake_at <= now``), one statement per page."""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.engine import Connection

from orbit_tasks.db.business_tables import sender_outbox
from orbit_tasks.db.engine import is_mysql
from orbit_tasks.sender import policy
from orbit_tasks.sender.policy import OutboxState
from orbit_tasks.sender.store.rows import values

o = sender_outbox


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A due row as the scan saw it, with what sending it needs (read in the same statement)."""

    namespace_id: str
    queue_id: str
    operation_id: str
    state: str
    lease_epoch: int
    send_count: int
    send_deadline_at: dt.datetime
    idempotency_key: str
    request_json: str
    request_digest: bytes


@dataclass(frozen=True, kw_only=True)
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


def namespace_queues(conn: Connection, namespace_id: str) -> list[str]:
    """Distinct queues with outbox rows in one namespace (a loose scan of ``ix_sender_due``)."""
    rows = conn.execute(
        select(o.c.queue_id)
        .where(o.c.namespace_id == namespace_id)
        .group_by(o.c.queue_id)
        .order_by(o.c.queue_id)
    )
    return [r[0] for r in rows]


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
            o.c.idempotency_key,
            o.c.request_json,
            o.c.request_digest,
        )
        .where(o.c.namespace_id == namespace_id, o.c.queue_id == queue_id, o.c.wake_at <= now)
        .order_by(o.c.wake_at, o.c.operation_id)
        .limit(limit)
    )
    if is_mysql(conn):
        # Only a hint to keep concurrent senders apart; the CAS below decides ownership.
        stmt = stmt.with_for_update(skip_locked=True)
    return values(Candidate, conn.execute(stmt))


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
        .values(state=OutboxState.REVIEW, wake_at=None, last_code=code, updated_at=now)
    )
    return result.rowcount == 1


def claim(conn: Connection, c: Candidate, now: dt.datetime, lease_seconds: float) -> bool:
    """Compare-and-set claim of one row (a page of one): one more send, a new epoch, SENDING
    until ``now + lease``."""
    return claim_many(conn, [c], now, lease_seconds)


@functools.lru_cache(maxsize=256)
def _claim_page(n: int) -> Any:
    """The claim statement for a page of ``n`` rows, built once per size: named parameters
    ``op<i>``/``st<i>``/``ep<i>``, so a page costs no expression building at run time."""
    as_seen = or_(
        *(
            and_(
                o.c.operation_id == bindparam(f"op{i}"),
                o.c.state == bindparam(f"st{i}"),
                o.c.lease_epoch == bindparam(f"ep{i}"),
            )
            for i in range(n)
        )
    )
    return (
        update(o)
        .where(
            o.c.namespace_id == bindparam("ns"),
            as_seen,
            o.c.wake_at <= bindparam("now", type_=o.c.wake_at.type),
            o.c.send_count < policy.MAX_SENDS,
            o.c.send_deadline_at > bindparam("now", type_=o.c.wake_at.type),
        )
        .values(
            send_count=o.c.send_count + 1,
            lease_epoch=o.c.lease_epoch + 1,
            state=OutboxState.SENDING,
            wake_at=bindparam("until", type_=o.c.wake_at.type),
            updated_at=bindparam("now", type_=o.c.wake_at.type),
        )
    )


def claim_many(
    conn: Connection, cands: list[Candidate], now: dt.datetime, lease_seconds: float
) -> bool:
    """The compare-and-set claim of several rows of one namespace in ONE statement: each row
    as seen (state, epoch), in the expanded form ``ns = :ns AND ((op = :a AND state = :sa AND
    epoch = :ea) OR ...)`` (a range on the primary key; docs/sender.md). True when every row
    matched; otherwise the caller must roll back (it cannot tell which rows it got) and claim
    one by one."""
    if not cands:
        return True
    ns = cands[0].namespace_id
    assert all(c.namespace_id == ns for c in cands)
    params: dict[str, Any] = {
        "ns": ns,
        "now": now,
        "until": now + dt.timedelta(seconds=lease_seconds),
    }
    for i, c in enumerate(cands):
        params[f"op{i}"], params[f"st{i}"], params[f"ep{i}"] = (
            c.operation_id,
            c.state,
            c.lease_epoch,
        )
    result = conn.execute(_claim_page(len(cands)), params)
    return result.rowcount == len(cands)


def claimed_row(c: Candidate, now: dt.datetime, lease_seconds: float) -> Claimed:
    """What a successful claim of ``c`` at ``now`` made of it (no read-back needed: the claim
    statement changed exactly these columns)."""
    return Claimed(
        namespace_id=c.namespace_id,
        queue_id=c.queue_id,
        operation_id=c.operation_id,
        idempotency_key=c.idempotency_key,
        request_json=c.request_json,
        request_digest=c.request_digest,
        send_count=c.send_count + 1,
        lease_epoch=c.lease_epoch + 1,
        claimed_at=now,
        lease_until=now + dt.timedelta(seconds=lease_seconds),
        send_deadline_at=c.send_deadline_at,
    )
