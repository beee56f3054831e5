"""Retention of the outbox (docs/sender.md "Retention"): prune ACCEPTED rows (and resolved REVIEW
rows) older than a duration, in short keyset-page transactions, keeping every promise.

Each page is one short transaction: read the next rows in primary-key order (any state, so a page
reads a bounded number of rows), delete the prunable ones *as seen* (state, epoch, ``updated_at``)
and insert their compact records (``sender_pruned``) in the same transaction. ``enqueue()`` reads
the outbox row first and the compact record second, so an enqueue racing a prune sees the
operation in one of the two. A page whose delete matches fewer rows than it named (a row changed
meanwhile) is rolled back and pruned row by row. ``sender_jobs`` rows stay.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from orbit_tasks import failpoints
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.errors import InvalidInput
from orbit_tasks.logs import log_action
from orbit_tasks.sender import policy
from orbit_tasks.sender.policy import OutboxState
from orbit_tasks.sender.store import pruning
from orbit_tasks.sender.store.pruning import PrunedRow, ScannedRow
from orbit_tasks.timestamps import format_ts

logger = logging.getLogger("orbit.sender.retention")
PAGE_ROWS = 500


@dataclass
class PruneReport:
    """What one prune did (or, with ``dry_run``, would do)."""

    older_than_seconds: int
    cutoff: dt.datetime
    dry_run: bool
    scanned: int = 0
    pages: int = 0
    pruned: dict[str, int] = field(default_factory=dict)  # state -> rows
    skipped_in_both: int = 0  # live rows of operations that already have a compact record
    next_after: tuple[str, str] | None = None  # set when the budget ran out before the end

    @property
    def total(self) -> int:
        return sum(self.pruned.values())

    def as_fields(self) -> dict[str, Any]:
        return {
            "older_than_seconds": self.older_than_seconds,
            "cutoff": format_ts(self.cutoff),
            "dry_run": self.dry_run,
            "scanned": self.scanned,
            "pages": self.pages,
            "pruned": self.total,
            "accepted": self.pruned.get(OutboxState.ACCEPTED, 0),
            "review": self.pruned.get(OutboxState.REVIEW, 0),
            "skipped_in_both": self.skipped_in_both,
            "next": None if self.next_after is None else ":".join(self.next_after),
        }


class _PageChanged(Exception):
    """A row of the page changed between the scan and the delete: roll the page back."""


def _record(row: ScannedRow, now: dt.datetime) -> PrunedRow:
    accepted = row.state == OutboxState.ACCEPTED
    return PrunedRow(
        namespace_id=row.namespace_id,
        operation_id=row.operation_id,
        queue_id=row.queue_id,
        request_digest=bytes(row.request_digest),
        source_ref_digest=None if row.source_ref is None else policy.digest(row.source_ref),
        state=row.state,
        last_code=row.last_code,
        task_id=row.task_id if accepted else None,
        created_at=row.created_at,
        send_deadline_at=row.send_deadline_at,
        accepted_at=row.updated_at if accepted else None,
        pruned_at=now,
    )


def prunable_rows(rows: list[ScannedRow], cutoff: dt.datetime) -> list[ScannedRow]:
    """The rows of a scanned page that may be pruned (``policy.prunable``); never a row whose
    operation already has a compact record (:func:`in_both`)."""
    out = []
    for row in rows:
        if row.already_pruned_at is not None:
            continue
        current = policy.resolution_current(row.state, row.updated_at, row.review_since)
        if policy.prunable(row.state, row.updated_at, row.resolved_at if current else None, cutoff):
            out.append(row)
    return out


def in_both(rows: list[ScannedRow]) -> list[ScannedRow]:
    """Rows of a scanned page whose operation is also in ``sender_pruned`` (an enqueue before
    issue 23 could create one from an old snapshot): skipped, never deleted, logged."""
    return [row for row in rows if row.already_pruned_at is not None]


def _skipped(report: PruneReport, rows: list[ScannedRow]) -> None:
    for row in rows:
        report.skipped_in_both += 1
        log_action(
            logger,
            "sender.prune.already_pruned",
            logging.WARNING,
            namespace_id=row.namespace_id,
            operation_id=row.operation_id,
            state=row.state,
            kept="the live row (docs/operations.md: outbox row already pruned)",
        )


def _prune_together(conn: Connection, rows: list[ScannedRow], now: dt.datetime) -> None:
    """Delete ``rows`` as seen and insert their compact records, in ``conn``'s transaction."""
    by_ns: dict[str, list[ScannedRow]] = {}
    for row in rows:
        by_ns.setdefault(row.namespace_id, []).append(row)
    for ns, seen in by_ns.items():
        if not pruning.delete_pruned(conn, ns, seen):
            raise _PageChanged
    pruning.insert_pruned(conn, [_record(row, now) for row in rows])
    failpoints.hit("sender.prune.before_commit")


def prune(
    engine: Engine,
    *,
    older_than_seconds: int,
    namespace_id: str | None = None,
    dry_run: bool = False,
    after: tuple[str, str] | None = None,
    budget_seconds: float | None = None,
    page_rows: int = PAGE_ROWS,
    clock: Clock = DB_CLOCK,
    monotonic: Callable[[], float] = time.monotonic,
) -> PruneReport:
    """Prune (or count, ``dry_run``) the outbox rows older than ``older_than_seconds`` after the
    cursor ``after``, page by page, until the end of the table (or of ``namespace_id``) or until
    ``budget_seconds`` ran out (then ``next_after`` is where to continue)."""
    refusal = policy.retention_refusal(older_than_seconds, "--older-than")
    if refusal:
        raise InvalidInput(refusal)
    started = monotonic()
    with engine.connect() as conn:
        cutoff = clock.now(conn) - dt.timedelta(seconds=older_than_seconds)
    report = PruneReport(older_than_seconds, cutoff, dry_run)
    cursor = after
    while True:
        if budget_seconds is not None and monotonic() - started >= budget_seconds:
            report.next_after = cursor
            break
        chosen: list[ScannedRow] = []
        try:
            with engine.begin() as conn:
                page = pruning.prune_scan(conn, namespace_id, cursor, page_rows)
                chosen = prunable_rows(page, cutoff)
                if chosen and not dry_run:
                    _prune_together(conn, chosen, clock.now(conn))
            done = chosen
        except (_PageChanged, IntegrityError):
            # IntegrityError: a compact record appeared since the scan (a live row of a pruned
            # operation, issue 23); each row alone, that one skipped.
            log_action(logger, "sender.prune.page_changed", rows=len(chosen))
            done, twice = _one_by_one(engine, chosen, clock)
            _skipped(report, twice)
        if not page:
            break
        _skipped(report, in_both(page))
        report.pages += 1
        report.scanned += len(page)
        cursor = (page[-1].namespace_id, page[-1].operation_id)
        for row in done:
            report.pruned[row.state] = report.pruned.get(row.state, 0) + 1
        if len(page) < page_rows:
            break
    log_action(
        logger,
        "sender.prune.done",
        dry_run=dry_run,
        namespace_id=namespace_id,
        older_than_seconds=older_than_seconds,
        scanned=report.scanned,
        pages=report.pages,
        pruned=report.total,
        skipped_in_both=report.skipped_in_both,
        more=report.next_after is not None,
    )
    return report


def _one_by_one(
    engine: Engine, rows: list[ScannedRow], clock: Clock
) -> tuple[list[ScannedRow], list[ScannedRow]]:
    """A page in which a row changed since the scan: each row in its own transaction; the rows
    actually pruned (a row requeued meanwhile, or pruned by another prune, is skipped) and the
    rows whose compact record exists already (kept, never deleted)."""
    done: list[ScannedRow] = []
    twice: list[ScannedRow] = []
    for row in rows:
        try:
            with engine.begin() as conn:
                _prune_together(conn, [row], clock.now(conn))
            done.append(row)
        except _PageChanged:
            continue
        except IntegrityError:
            twice.append(row)
    return done, twice
