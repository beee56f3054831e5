"""Dead letters (docs/sender.md "Dead letters"): requeue REVIEW rows one by one or by code, and
resolve them — an operator marks a REVIEW row as handled, recorded with who and why.

A resolution belongs to the review it was recorded on (``sender_resolutions.review_since`` is the
row's ``updated_at`` then): a requeue, or any later write of the row, ends it without touching
the resolution table, so a row that comes back to REVIEW is unresolved again. Resolved rows
leave ``orbit_outbox_review_rows`` and may be pruned after the retention (retention.py).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Connection

from orbit_tasks import failpoints
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.errors import IllegalState, InvalidInput, NotFound
from orbit_tasks.logs import log_action
from orbit_tasks.sender import policy
from orbit_tasks.sender.store import dead_letters, entries, pruning
from orbit_tasks.sender.store.dead_letters import ReviewRow
from orbit_tasks.sender.store.entries import OutboxRow
from orbit_tasks.timestamps import format_optional

logger = logging.getLogger("orbit.sender.review")
PAGE_ROWS = 200


def _iso(value: dt.datetime | None) -> str | None:
    return format_optional(value)


def _item(row: ReviewRow | OutboxRow, action: str, why: str = "") -> dict[str, Any]:
    return {
        "namespace_id": row.namespace_id,
        "operation_id": row.operation_id,
        "last_code": row.last_code,
        "send_count": row.send_count,
        "send_deadline_at": _iso(row.send_deadline_at),
        "action": action,
        "why": why or None,
    }


def _pages(
    engine: Engine, code: str, namespace_id: str | None, *, unresolved: bool
) -> Iterator[tuple[Connection, dt.datetime, list[ReviewRow]]]:
    """REVIEW rows with ``code``, one keyset page per short transaction (with its ``now``)."""
    if code not in policy.REVIEW_CODES:
        allowed = ", ".join(sorted(policy.REVIEW_CODES))
        raise InvalidInput(f"--code {code!r} is not a REVIEW code (allowed: {allowed})")
    after: tuple[str, str] | None = None
    while True:
        with engine.begin() as conn:
            page = dead_letters.review_page(
                conn,
                last_code=code,
                namespace_id=namespace_id,
                after=after,
                limit=PAGE_ROWS,
                unresolved=unresolved,
            )
            if not page:
                return
            yield conn, DB_CLOCK.now(conn), page
        if len(page) < PAGE_ROWS:
            return
        after = (page[-1].namespace_id, page[-1].operation_id)


# --- requeue ---------------------------------------------------------------------------------


def requeue_one(
    engine: Engine, ns: str, op: str, clock: Clock = DB_CLOCK, *, dry_run: bool = False
) -> OutboxRow:
    """``orbit sender requeue NS OP``: REVIEW -> PENDING, same key and body; the row as it was.
    Refused (IllegalState, exit 3) past its deadline, at 100 sends, not in REVIEW, or pruned.
    ``dry_run``: the same checks, nothing written."""
    with engine.begin() as conn:
        row = locked(conn, ns, op, "requeue")
        now = clock.now(conn)
        why = policy.requeue_refusal(now, row.state, row.send_count, row.send_deadline_at)
        if why:
            raise IllegalState(f"cannot requeue {ns}/{op}: {why}")
        if dry_run:
            return row
        if not dead_letters.requeue(conn, row, now):
            raise IllegalState(f"cannot requeue {ns}/{op}: the row changed meanwhile; retry")
    _logged_requeue(row)
    return row


def _logged_requeue(row: OutboxRow) -> None:
    log_action(
        logger,
        "sender.row.requeued",
        namespace_id=row.namespace_id,
        operation_id=row.operation_id,
        previous_code=row.last_code,
        send_count=row.send_count,
    )


def _resolved_by(conn: Connection, row: OutboxRow) -> str | None:
    """Who resolved the current review of ``row`` (newest committed resolution), or None."""
    found = dead_letters.get_resolution(conn, row.namespace_id, row.operation_id, latest=True)
    if found is None:
        return None
    if not policy.resolution_current(row.state, row.updated_at, found.review_since):
        return None
    return str(found.resolved_by)


def requeue_code(
    engine: Engine, code: str, namespace_id: str | None, *, dry_run: bool
) -> list[dict[str, Any]]:
    """Every REVIEW row with ``code`` (in ``namespace_id``): requeued (the single-row rule and
    statement, row by row), or refused with the reason (resolved, deadline passed, 100 sends,
    changed meanwhile); with ``dry_run`` what would happen. A resolved row is one an operator
    marked as handled (e.g. re-created by hand): sending it in bulk could do its work twice, so
    only naming it (:func:`requeue_one`) sends it. Each row is locked and read again before
    its decision (:func:`entries.lock_row`): a resolve racing the requeue is either seen (the row
    is refused) or waits and then finds the row requeued (it is refused)."""
    items = []
    for conn, now, page in _pages(engine, code, namespace_id, unresolved=False):
        failpoints.hit("sender.requeue.after_page")  # a page read, nothing locked yet
        for seen in page:
            row = seen if dry_run else entries.lock_row(conn, seen.namespace_id, seen.operation_id)
            if row is None or row.state != seen.state or row.updated_at != seen.updated_at:
                items.append(_item(seen, "refused", "the row changed meanwhile"))
                continue
            resolver = _resolved_by(conn, row) if isinstance(row, OutboxRow) else seen.resolved_by
            why = policy.requeue_refusal(now, row.state, row.send_count, row.send_deadline_at)
            if not why and resolver is not None:
                why = (
                    f"resolved by {resolver}: handled by hand; "
                    f"`orbit sender requeue {row.namespace_id} {row.operation_id}` sends it"
                )
            if why:
                items.append(_item(seen, "refused", why))
            elif dry_run:
                items.append(_item(seen, "would_requeue"))
            elif isinstance(row, OutboxRow) and dead_letters.requeue(conn, row, now):
                items.append(_item(seen, "requeued"))
                _logged_requeue(row)
            else:
                items.append(_item(seen, "refused", "the row changed meanwhile"))
        failpoints.hit("sender.requeue.before_commit")  # the page's rows locked and requeued
    return items


# --- resolve ---------------------------------------------------------------------------------


def load(conn: Connection, ns: str, op: str) -> OutboxRow:
    row = entries.get_row(conn, ns, op)
    if row is None:
        raise NotFound(f"outbox row namespace {ns} operation {op} does not exist")
    return row


def locked(conn: Connection, ns: str, op: str, verb: str) -> OutboxRow:
    """The row (ns, op) locked for a dead-letter command; a pruned operation is a conflict
    (exit 3: its record is there, ``sender show`` prints it), a missing one NotFound (exit 4)."""
    row = entries.lock_row(conn, ns, op)
    if row is not None:
        return row
    if pruning.get_pruned(conn, ns, op) is not None:
        raise IllegalState(
            f"cannot {verb} {ns}/{op}: the operation was pruned (its compact record is in "
            f"sender_pruned: `orbit sender show {ns} {op}`); there is no row to {verb}"
        )
    return load(conn, ns, op)  # NotFound


def _checked(reason: str, actor: str) -> tuple[str, str]:
    why = policy.reason_refusal(reason)
    if why:
        raise InvalidInput(why)
    return reason, actor[: policy.MAX_ACTOR_CHARS]


def _logged_resolution(row: ReviewRow | OutboxRow, actor: str) -> None:
    log_action(
        logger,
        "sender.row.resolved",
        namespace_id=row.namespace_id,
        operation_id=row.operation_id,
        last_code=row.last_code,
        resolved_by=actor,
    )


def resolve_one(
    engine: Engine,
    ns: str,
    op: str,
    *,
    reason: str,
    actor: str,
    clock: Clock = DB_CLOCK,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Mark the REVIEW row (ns, op) as handled by ``actor`` for ``reason``. Refused (exit 3)
    when it is not in REVIEW, pruned, or already resolved (naming by whom). The row is locked
    first (see :func:`requeue_code`). ``dry_run``: the same checks, nothing written."""
    reason, actor = _checked(reason, actor)
    with engine.begin() as conn:
        row = locked(conn, ns, op, "resolve")
        if row.state != policy.OutboxState.REVIEW:
            raise IllegalState(
                f"cannot resolve {ns}/{op}: state is {row.state}; only REVIEW rows are resolved"
            )
        now = clock.now(conn)
        if _resolved_by(conn, row) is not None or (
            not dry_run
            and not dead_letters.record_resolution(
                conn, row, resolved_by=actor, reason=reason, now=now
            )
        ):
            found = dead_letters.get_resolution(conn, ns, op, latest=True)
            assert found is not None  # read after the one that was there, newest committed
            raise IllegalState(
                f"cannot resolve {ns}/{op}: already resolved by {found.resolved_by} at "
                f"{_iso(found.resolved_at)}"
            )
    if not dry_run:
        _logged_resolution(row, actor)
    return {
        "namespace_id": ns,
        "operation_id": op,
        "last_code": row.last_code,
        "resolved_by": actor,
        "resolved_at": _iso(now),
        "reason": reason,
    }


def resolve_code(
    engine: Engine,
    code: str,
    namespace_id: str | None,
    *,
    reason: str,
    actor: str,
    dry_run: bool,
) -> list[dict[str, Any]]:
    """Resolve every unresolved REVIEW row with ``code`` (in ``namespace_id``)."""
    reason, actor = _checked(reason, actor)
    items = []
    for conn, now, page in _pages(engine, code, namespace_id, unresolved=True):
        for row in page:
            if dry_run:
                items.append(_item(row, "would_resolve"))
                continue
            current = entries.lock_row(conn, row.namespace_id, row.operation_id)
            if current is None or (current.state, current.updated_at) != (
                row.state,
                row.updated_at,
            ):
                items.append(_item(row, "skipped", "the row changed meanwhile (requeued)"))
            elif _resolved_by(conn, current) is None and dead_letters.record_resolution(
                conn, current, resolved_by=actor, reason=reason, now=now
            ):
                items.append(_item(row, "resolved"))
                _logged_resolution(row, actor)
            else:
                items.append(_item(row, "skipped", "resolved meanwhile by someone else"))
    return items
