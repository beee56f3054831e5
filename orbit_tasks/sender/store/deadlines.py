"""The deadline sweep: due rows past their send deadline -> REVIEW ``DEADLINE_EXCEEDED``, across
every namespace and queue (also those no sender can claim)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from orbit_tasks.db.business_tables import sender_outbox
from orbit_tasks.db.engine import is_mysql
from orbit_tasks.sender import policy
from orbit_tasks.sender.policy import OutboxState

o = sender_outbox


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
