"""Dead letters: REVIEW rows page by page with their current resolution, the resolutions
(``sender_resolutions``), and the requeue of a REVIEW row as read."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from orbit_tasks.db.business_tables import sender_outbox, sender_resolutions
from orbit_tasks.sender import policy
from orbit_tasks.sender.policy import OutboxState
from orbit_tasks.sender.store.entries import OutboxRow
from orbit_tasks.sender.store.rows import one_operation, page_after, values

o = sender_outbox
r = sender_resolutions


@dataclass(frozen=True, kw_only=True)
class ReviewRow:
    """A REVIEW row as a review page read it, with its current resolution if any."""

    namespace_id: str
    operation_id: str
    queue_id: str
    state: str
    last_code: str
    send_count: int
    lease_epoch: int
    send_deadline_at: dt.datetime
    updated_at: dt.datetime
    resolved_by: str | None
    resolved_at: dt.datetime | None


@dataclass(frozen=True, kw_only=True)
class ResolutionRow:
    """One ``sender_resolutions`` row: who resolved which review (``review_since``) and why."""

    namespace_id: str
    operation_id: str
    review_since: dt.datetime
    last_code: str
    resolved_by: str
    reason: str
    resolved_at: dt.datetime


def current_resolution() -> ColumnElement[bool]:
    """The join of an outbox row to the resolution of its current review."""
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
) -> list[ReviewRow]:
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
        .select_from(o.outerjoin(r, current_resolution()))
        .where(o.c.state == OutboxState.REVIEW, o.c.last_code == last_code)
        .where(*page_after(after, namespace_id))
        .order_by(o.c.namespace_id, o.c.operation_id)
        .limit(limit)
    )
    if unresolved:
        stmt = stmt.where(r.c.namespace_id.is_(None))
    return values(ReviewRow, conn.execute(stmt))


def get_resolution(
    conn: Connection, namespace_id: str, operation_id: str, latest: bool = False
) -> ResolutionRow | None:
    return one_operation(conn, r, ResolutionRow, namespace_id, operation_id, latest=latest)


def record_resolution(
    conn: Connection,
    row: OutboxRow,
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


def requeue(conn: Connection, row: OutboxRow, now: dt.datetime) -> bool:
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
