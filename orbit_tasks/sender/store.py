"""Every SQL statement of the outbox sender (business database, SQLAlchemy Core).

Ownership of a row is the compare-and-set claim (``state``/``lease_epoch``/``wake_at`` as seen);
every outcome write is fenced by ``lease_epoch = :mine AND state = 'SENDING'``: ``rowcount != 1``
means a newer claim owns the row and the result is dropped.

Time: every function takes ``now`` as a value. Callers read it through the project's one seam,
:class:`orbit_tasks.db.engine.Clock` (default ``DB_CLOCK``, SPEC §2 "one clock"), so that tests
can put the store at ``boundary - 1 µs``, ``= boundary`` and ``+ 1 µs`` without sleeping.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from orbit_tasks.db.business_tables import (
    sender_jobs,
    sender_outbox,
    sender_pruned,
    sender_resolutions,
)
from orbit_tasks.db.engine import is_mysql
from orbit_tasks.sender import policy
from orbit_tasks.sender.policy import OutboxState

o = sender_outbox
j = sender_jobs
p = sender_pruned
r = sender_resolutions


@dataclass(frozen=True)
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


def _latest(stmt: Any, latest: bool) -> Any:
    """``latest``: a locking read (``LOCK IN SHARE MODE`` on MySQL/MariaDB), which reads the
    newest committed row whatever the caller's isolation level; a plain read under REPEATABLE
    READ keeps the snapshot of the transaction's first read (SQLite: a plain read)."""
    return stmt.with_for_update(read=True) if latest else stmt


def get_row(conn: Connection, namespace_id: str, operation_id: str, latest: bool = False) -> Any:
    stmt = select(o).where(o.c.namespace_id == namespace_id, o.c.operation_id == operation_id)
    return conn.execute(_latest(stmt, latest)).first()


def get_job(conn: Connection, namespace_id: str, operation_id: str, latest: bool = False) -> Any:
    stmt = select(j).where(j.c.namespace_id == namespace_id, j.c.operation_id == operation_id)
    return conn.execute(_latest(stmt, latest)).first()


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
            state=OutboxState.PENDING,
            send_count=0,
            lease_epoch=0,
            wake_at=now,
            send_deadline_at=now + policy.SEND_WINDOW,
            last_code=policy.LastCode.NEW,
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
    return [
        Candidate(**{**r._asdict(), "request_digest": bytes(r.request_digest)})
        for r in conn.execute(stmt)
    ]


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


# --- fenced outcome writes ---------------------------------------------------------------------


def _mine(row: Claimed) -> Any:
    return and_(
        o.c.namespace_id == row.namespace_id,
        o.c.operation_id == row.operation_id,
        o.c.lease_epoch == row.lease_epoch,
        o.c.state == OutboxState.SENDING,
    )


def write_accepted(
    conn: Connection, row: Claimed, task_id: str, receipt_json: str, now: dt.datetime
) -> bool:
    """ACCEPTED with the original receipt, and ``sender_jobs.task_id`` in the same transaction
    (a page of one)."""
    return write_accepted_many(conn, [(row, task_id, receipt_json)], now)


@functools.lru_cache(maxsize=256)
def _accept_page(n: int) -> tuple[Any, Any]:
    """The two statements that record a page of ``n`` accepted rows, built once per size:
    the outbox rows, each fenced by its epoch, then their ``sender_jobs`` rows."""
    mine = or_(
        *(
            and_(o.c.operation_id == bindparam(f"op{i}"), o.c.lease_epoch == bindparam(f"ep{i}"))
            for i in range(n)
        )
    )

    def by_op(column: Any, value: str, type_: Any) -> Any:
        whens = [
            (column == bindparam(f"op{i}"), bindparam(f"{value}{i}", type_=type_)) for i in range(n)
        ]
        return case(*whens)

    outbox = (
        update(o)
        .where(o.c.namespace_id == bindparam("ns"), mine, o.c.state == OutboxState.SENDING)
        .values(
            state=OutboxState.ACCEPTED,
            wake_at=None,
            last_code=policy.LastCode.ACCEPTED,
            task_id=by_op(o.c.operation_id, "tid", o.c.task_id.type),
            receipt_json=by_op(o.c.operation_id, "rec", o.c.receipt_json.type),
            updated_at=bindparam("now", type_=o.c.updated_at.type),
        )
    )
    jobs = (
        update(j)
        .where(
            j.c.namespace_id == bindparam("ns"),
            j.c.operation_id.in_([bindparam(f"op{i}") for i in range(n)]),
        )
        .values(
            task_id=by_op(j.c.operation_id, "tid", j.c.task_id.type),
            updated_at=bindparam("now", type_=j.c.updated_at.type),
        )
    )
    return outbox, jobs


def write_accepted_many(
    conn: Connection, accepted: list[tuple[Claimed, str, str]], now: dt.datetime
) -> bool:
    """:func:`write_accepted` for several rows of one namespace in two statements, each row
    fenced by its own epoch (``(op = :a AND epoch = :ea) OR ...``, state SENDING). True when
    every row was written (then ``sender_jobs`` too); otherwise the caller must roll back (it
    cannot tell which rows were stale) and write them one by one."""
    if not accepted:
        return True
    ns = accepted[0][0].namespace_id
    assert all(row.namespace_id == ns for row, _t, _r in accepted)
    params: dict[str, Any] = {"ns": ns, "now": now}
    for i, (row, task_id, receipt) in enumerate(accepted):
        params[f"op{i}"], params[f"ep{i}"] = row.operation_id, row.lease_epoch
        params[f"tid{i}"], params[f"rec{i}"] = task_id, receipt
    outbox, jobs = _accept_page(len(accepted))
    if conn.execute(outbox, params).rowcount != len(accepted):
        return False
    conn.execute(jobs, params)
    return True


def write_retry(
    conn: Connection, row: Claimed, code: str, wake_at: dt.datetime, now: dt.datetime
) -> bool:
    assert code in policy.RETRY_CODES
    result = conn.execute(
        update(o)
        .where(_mine(row))
        .values(state=OutboxState.PENDING, wake_at=wake_at, last_code=code, updated_at=now)
    )
    return result.rowcount == 1


def write_review(conn: Connection, row: Claimed, code: str, now: dt.datetime) -> bool:
    assert code in policy.REVIEW_CODES
    result = conn.execute(
        update(o)
        .where(_mine(row))
        .values(state=OutboxState.REVIEW, wake_at=None, last_code=code, updated_at=now)
    )
    return result.rowcount == 1


def release(conn: Connection, row: Claimed, now: dt.datetime) -> bool:
    """Give an unsent claim back (PENDING, due now, ``last_code`` unchanged)."""
    result = conn.execute(
        update(o).where(_mine(row)).values(state=OutboxState.PENDING, wake_at=now, updated_at=now)
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
        stmt = (
            select(o.c.operation_id, o.c.state, o.c.lease_epoch)
            .where(
                o.c.namespace_id == ns,
                o.c.queue_id == queue,
                o.c.wake_at <= now,
                o.c.send_deadline_at <= now,
            )
            .order_by(o.c.wake_at, o.c.operation_id)
            .limit(limit - moved)
        )
        if is_mysql(conn):
            # A row another session holds (a frozen sender's uncommitted claim) is skipped, not
            # waited for: the next sweep takes it once the server has rolled that back.
            stmt = stmt.with_for_update(skip_locked=True)
        rows = conn.execute(stmt).all()
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
                    state=OutboxState.REVIEW,
                    wake_at=None,
                    last_code=policy.LastCode.DEADLINE_EXCEEDED,
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
    unresolved: bool = False,
) -> list[dict[str, Any]]:
    """Rows in (namespace, operation) order, keyset-paginated after ``after``; ``unresolved``:
    only REVIEW rows without a current resolution (``sender list --unresolved``)."""
    stmt = select(*(o.c[name] for name in LIST_COLUMNS))
    if unresolved:
        stmt = (
            stmt.select_from(o.outerjoin(r, _current_resolution()))
            .where(o.c.state == OutboxState.REVIEW)
            .where(r.c.namespace_id.is_(None))
        )
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
    return [dict(found._mapping) for found in conn.execute(stmt)]


def requeue(conn: Connection, row: Any, now: dt.datetime) -> bool:
    """REVIEW -> PENDING, same key and body, due now; compare-and-set on what was read."""
    result = conn.execute(
        update(o)
        .where(
            o.c.namespace_id == row.namespace_id,
            o.c.operation_id == row.operation_id,
            o.c.state == OutboxState.REVIEW,
            o.c.lease_epoch == row.lease_epoch,
            o.c.send_count < policy.MAX_SENDS,
            o.c.send_deadline_at > now,
        )
        .values(state=OutboxState.PENDING, wake_at=now, updated_at=now)
    )
    return result.rowcount == 1


def _after(after: tuple[str, str] | None, namespace_id: str | None) -> list[Any]:
    """The keyset condition after ``after`` on the primary key, in the expanded form
    ``ns > :ns OR (ns = :ns AND op > :op)`` (``ns = :ns AND op > :op`` inside one namespace)."""
    where: list[Any] = []
    if namespace_id is not None:
        where.append(o.c.namespace_id == namespace_id)
        if after is not None:
            where.append(o.c.operation_id > after[1])
    elif after is not None:
        where.append(
            or_(
                o.c.namespace_id > after[0],
                and_(o.c.namespace_id == after[0], o.c.operation_id > after[1]),
            )
        )
    return where


# --- retention (docs/sender.md "Retention") ------------------------------------------------------


def get_pruned(conn: Connection, namespace_id: str, operation_id: str, latest: bool = False) -> Any:
    """The compact record of a pruned operation, or None (``latest``: see :func:`get_row`)."""
    stmt = select(p).where(p.c.namespace_id == namespace_id, p.c.operation_id == operation_id)
    return conn.execute(_latest(stmt, latest)).first()


def prune_scan_query(namespace_id: str | None, after: tuple[str, str] | None, limit: int) -> Any:
    """The next ``limit`` outbox rows in primary-key order (whatever their state: a page reads
    exactly that many rows, no index on state is needed), with what a compact record keeps:
    the ``sender_jobs`` reference and the row's resolution, and whether the operation already
    has a compact record (``already_pruned_at``; all three by primary key)."""
    return (
        select(
            o.c.namespace_id,
            o.c.operation_id,
            o.c.queue_id,
            o.c.state,
            o.c.last_code,
            o.c.lease_epoch,
            o.c.request_digest,
            o.c.task_id,
            o.c.created_at,
            o.c.send_deadline_at,
            o.c.updated_at,
            j.c.source_ref,
            r.c.review_since,
            r.c.resolved_at,
            p.c.pruned_at.label("already_pruned_at"),
        )
        .select_from(
            o.outerjoin(
                j, and_(j.c.namespace_id == o.c.namespace_id, j.c.operation_id == o.c.operation_id)
            )
            .outerjoin(
                r, and_(r.c.namespace_id == o.c.namespace_id, r.c.operation_id == o.c.operation_id)
            )
            .outerjoin(
                p, and_(p.c.namespace_id == o.c.namespace_id, p.c.operation_id == o.c.operation_id)
            )
        )
        .where(*_after(after, namespace_id))
        .order_by(o.c.namespace_id, o.c.operation_id)
        .limit(limit)
    )


def prune_scan(
    conn: Connection, namespace_id: str | None, after: tuple[str, str] | None, limit: int
) -> list[Any]:
    return list(conn.execute(prune_scan_query(namespace_id, after, limit)))


@functools.lru_cache(maxsize=256)
def _prune_delete(n: int) -> Any:
    """DELETE of ``n`` rows of one namespace, each fenced by what the scan saw (state, epoch,
    ``updated_at``: any write since changes one of them), in the expanded primary-key form."""
    as_seen = or_(
        *(
            and_(
                o.c.operation_id == bindparam(f"op{i}"),
                o.c.state == bindparam(f"st{i}"),
                o.c.lease_epoch == bindparam(f"ep{i}"),
                o.c.updated_at == bindparam(f"up{i}", type_=o.c.updated_at.type),
            )
            for i in range(n)
        )
    )
    # The IN list names the primary-key points (the optimizer takes the OR of row fences alone
    # for a range of ix_sender_due's namespace prefix on a small table).
    points = o.c.operation_id.in_([bindparam(f"op{i}") for i in range(n)])
    return delete(o).where(o.c.namespace_id == bindparam("ns"), points, as_seen)


def delete_pruned(conn: Connection, namespace_id: str, seen: list[Any]) -> bool:
    """Delete the outbox rows ``seen`` (one namespace) as seen. True when every row matched;
    otherwise the caller must roll back and prune them one by one."""
    params: dict[str, Any] = {"ns": namespace_id}
    for i, row in enumerate(seen):
        params[f"op{i}"], params[f"st{i}"] = row.operation_id, row.state
        params[f"ep{i}"], params[f"up{i}"] = row.lease_epoch, row.updated_at
    return bool(conn.execute(_prune_delete(len(seen)), params).rowcount == len(seen))


def insert_pruned(conn: Connection, records: list[dict[str, Any]]) -> None:
    """The compact records of rows deleted in the same transaction."""
    if records:
        conn.execute(insert(p), records)


# --- dead letters: review pages and resolutions --------------------------------------------------


def _current_resolution() -> Any:
    return and_(
        r.c.namespace_id == o.c.namespace_id,
        r.c.operation_id == o.c.operation_id,
        r.c.review_since == o.c.updated_at,
    )


def review_page(
    conn: Connection,
    *,
    last_code: str,
    namespace_id: str | None,
    after: tuple[str, str] | None,
    limit: int,
    unresolved: bool,
) -> list[Any]:
    """REVIEW rows with ``last_code`` in primary-key order after ``after`` (keyset), with their
    current resolution if any (``unresolved``: only rows without one)."""
    stmt = (
        select(
            o.c.namespace_id,
            o.c.operation_id,
            o.c.queue_id,
            o.c.state,
            o.c.last_code,
            o.c.send_count,
            o.c.lease_epoch,
            o.c.send_deadline_at,
            o.c.updated_at,
            r.c.resolved_by,
            r.c.resolved_at,
        )
        .select_from(o.outerjoin(r, _current_resolution()))
        .where(o.c.state == OutboxState.REVIEW, o.c.last_code == last_code)
        .where(*_after(after, namespace_id))
        .order_by(o.c.namespace_id, o.c.operation_id)
        .limit(limit)
    )
    if unresolved:
        stmt = stmt.where(r.c.namespace_id.is_(None))
    return list(conn.execute(stmt))


def get_resolution(
    conn: Connection, namespace_id: str, operation_id: str, latest: bool = False
) -> Any:
    stmt = select(r).where(r.c.namespace_id == namespace_id, r.c.operation_id == operation_id)
    return conn.execute(_latest(stmt, latest)).first()


def lock_row(conn: Connection, namespace_id: str, operation_id: str) -> Any:
    """The outbox row, newest committed, locked until the transaction ends (``FOR UPDATE``;
    SQLite: the transaction's write lock). Every dead-letter command locks the row before it
    decides (requeue, resolve), so that a resolve and a requeue of one row are one after the
    other: a resolved row is never requeued in bulk, a requeued row never reported resolved."""
    stmt = select(o).where(o.c.namespace_id == namespace_id, o.c.operation_id == operation_id)
    return conn.execute(stmt.with_for_update()).first()


def record_resolution(
    conn: Connection,
    row: Any,
    *,
    resolved_by: str,
    reason: str,
    now: dt.datetime,
) -> bool:
    """Record who resolved the REVIEW row ``row`` (as read: ``updated_at`` is the review it
    resolves) and why. A resolution of an earlier review of the same operation (the row was
    requeued since) is replaced. False when the row is already resolved (someone else was
    first). A row changed meanwhile gets a resolution that no longer holds (harmless)."""
    conn.execute(
        delete(r).where(
            r.c.namespace_id == row.namespace_id,
            r.c.operation_id == row.operation_id,
            r.c.review_since != row.updated_at,
        )
    )
    try:
        with conn.begin_nested():
            conn.execute(
                insert(r).values(
                    namespace_id=row.namespace_id,
                    operation_id=row.operation_id,
                    review_since=row.updated_at,
                    last_code=row.last_code,
                    resolved_by=resolved_by,
                    reason=reason,
                    resolved_at=now,
                )
            )
    except IntegrityError:
        return False
    return True
