"""The fenced outcome writes of a claimed row (ACCEPTED, retry, REVIEW, release): each fenced by
``lease_epoch = :mine AND state = 'SENDING'``; False means a newer claim owns the row."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from sqlalchemy import and_, bindparam, case, or_, update
from sqlalchemy.engine import Connection

from orbit_tasks.db.business_tables import sender_jobs, sender_outbox
from orbit_tasks.sender import policy
from orbit_tasks.sender.policy import OutboxState
from orbit_tasks.sender.store.claims import Claimed

o = sender_outbox
j = sender_jobs


def _fenced(conn: Connection, row: Claimed, **values: Any) -> bool:
    """Write ``values`` to the row if this claim still owns it (its epoch, state SENDING)."""
    mine = and_(
        o.c.namespace_id == row.namespace_id,
        o.c.operation_id == row.operation_id,
        o.c.lease_epoch == row.lease_epoch,
        o.c.state == OutboxState.SENDING,
    )
    return conn.execute(update(o).where(mine).values(**values)).rowcount == 1


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
    return _fenced(
        conn, row, state=OutboxState.PENDING, wake_at=wake_at, last_code=code, updated_at=now
    )


def write_review(conn: Connection, row: Claimed, code: str, now: dt.datetime) -> bool:
    assert code in policy.REVIEW_CODES
    return _fenced(
        conn, row, state=OutboxState.REVIEW, wake_at=None, last_code=code, updated_at=now
    )


def release(conn: Connection, row: Claimed, now: dt.datetime) -> bool:
    """Give an unsent claim back (PENDING, due now, ``last_code`` unchanged)."""
    return _fenced(conn, row, state=OutboxState.PENDING, wake_at=now, updated_at=now)
