"""One relay pass (SPEC §8): identity, deadline sweep, claim due rows page by page, send them
concurrently, write fenced outcomes. A stale sender's result is dropped and logged.

Shape of a pass (docs/sender.md "Relay"): sending threads only talk HTTP; the pass's own thread
holds one database connection and, in ONE transaction per step, writes the outcomes of the sends
that finished and claims the next page (one compare-and-set statement per queue page). Each row
keeps its own fence; only the commits are shared. Time is read through two seams: ``clock``
(the database clock, for every lease and deadline decision) and ``monotonic`` (elapsed time
within the pass), so that tests can run the relay at exact boundaries without sleeping.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from orbit_tasks import counters, failpoints, shutdown
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.db.faults import DEADLOCK, driver_code
from orbit_tasks.logs import log_action
from orbit_tasks.sender import holds, policy
from orbit_tasks.sender.client import Identity, IdentityUnavailable, PlatformClient
from orbit_tasks.sender.pass_records import (
    BatchRaced,
    Dropped,
    Finished,
    Owned,
    PassStats,
    RowResult,
    SendAction,
    SendOutcome,
    Sent,
)
from orbit_tasks.sender.policy import LastCode, OutcomeKind, ReleaseReason
from orbit_tasks.sender.store import claims, deadlines, outcomes
from orbit_tasks.timestamps import format_ts

__all__ = ["Owned", "PassStats", "Relay", "Sent"]

logger = logging.getLogger("orbit.sender.relay")

SWEEP_LIMIT = 500
# The claim guards catch due rows of claimable queues at once; the sweep is for the rest (rows no
# credential can claim), so once per interval per process is enough and keeps big backlogs cheap.
SWEEP_INTERVAL_SECONDS = 30.0
QUEUE_SCAN_SECONDS = 10.0  # how often the namespace's queues with outbox rows are re-read
# Answers whose Retry-After holds every send to that (namespace, queue) in this process.
HOLD_STATUSES = frozenset({429, 503})
DEFAULT_CLAIM_SECONDS = 20.0
PAGE_PER_THREAD = 2
WINDOW_PER_THREAD = 4
T = TypeVar("T")
Monotonic = Callable[[], float]
LogEntry = tuple[str, int, dict[str, Any]]
# What one POST's recorded outcome adds to the counters once its transaction committed: the
# outcome code (STALE: dropped by the fence) and, for an ACCEPTED row, its enqueue-to-accept lag.
SendCount = tuple[SendOutcome, float | None]


def _fields(row: claims.Claimed) -> dict[str, Any]:
    return dict(
        namespace_id=row.namespace_id,
        operation_id=row.operation_id,
        queue_id=row.queue_id,
        epoch=row.lease_epoch,
        send_count=row.send_count,
    )


def _flush(entries: list[LogEntry], sends: list[SendCount] | None = None) -> None:
    """Log and count what a transaction did, once it committed (a page redone row by row is
    counted once)."""
    for action, level, fields in entries:
        log_action(logger, action, level, **fields)
    for outcome, lag in sends or ():
        counters.SENDS.labels(outcome).inc()
        if lag is not None:
            counters.ACCEPT_LAG_SECONDS.observe(lag)


def _lag(row: claims.Claimed, now: dt.datetime) -> float:
    """Seconds from enqueue to ``now``: ``created_at`` is ``send_deadline_at - SEND_WINDOW``
    (fixed together at insert), so no extra column is read."""
    return max(0.0, (now - (row.send_deadline_at - policy.SEND_WINDOW)).total_seconds())


class Relay:
    """Sends due outbox rows of the credential's namespace. One per process is enough."""

    def __init__(
        self,
        engine: Engine,
        client: PlatformClient,
        *,
        lease_seconds: float,
        timeout_seconds: float,
        concurrency: int,
        rng: policy.RandomSource | None = None,
        clock: Clock = DB_CLOCK,
        monotonic: Monotonic = time.monotonic,
    ) -> None:
        self.engine = engine
        self.client = client
        self.lease_seconds = lease_seconds
        self.timeout_seconds = timeout_seconds
        self.concurrency = max(1, concurrency)
        self.rng = rng or random.SystemRandom()
        self.clock = clock
        self.monotonic = monotonic
        self._queue_offset = 0
        self._ns_queues: dict[str, tuple[float, frozenset[str]]] = {}
        # (namespace, queue) -> monotonic end of a Retry-After the platform asked for
        self._holds: dict[tuple[str, str], float] = {}
        self._holds_lock = threading.Lock()
        self._last_sweep: float | None = None

    # --- transactions --------------------------------------------------------------------------

    def _in_transaction(
        self, conn: Connection, fn: Callable[[Connection, bool], T], attempts: int = 3
    ) -> T:
        """Run ``fn(conn, batched)`` in one transaction on ``conn``; retry a deadlock a few
        times, and a raced page statement once with single-row statements. A lock wait timeout
        is not retried: the row is another session's (candidates skip locked rows, so it is an
        operator's or a frozen node's), and waiting again could overrun the pass's limits."""
        batched = True
        for attempt in range(attempts):
            try:
                with conn.begin():
                    return fn(conn, batched)
            except BatchRaced:
                batched = False
            except OperationalError as exc:
                if driver_code(exc) != DEADLOCK or attempt == attempts - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))
        with conn.begin():
            return fn(conn, False)

    def _transaction(self, fn: Callable[[Connection, bool], T]) -> T:
        with self.engine.connect() as conn:
            return self._in_transaction(conn, fn)

    # --- claiming ------------------------------------------------------------------------------

    def sweep(self) -> int:
        moved = self._transaction(
            lambda conn, _b: deadlines.sweep_deadlines(conn, self.clock.now(conn), SWEEP_LIMIT)
        )
        if moved:
            log_action(logger, "sender.sweep.deadline_exceeded", rows=moved)
        return moved

    def _claim_queues(self, conn: Connection, identity: Identity) -> list[str]:
        """The allowed queues plus every queue of the namespace that has outbox rows (the
        latter re-read at most every QUEUE_SCAN_SECONDS)."""
        cached = self._ns_queues.get(identity.namespace_id)
        if cached is None or self.monotonic() - cached[0] >= QUEUE_SCAN_SECONDS:
            found = claims.namespace_queues(conn, identity.namespace_id)
            cached = (self.monotonic(), frozenset(found))
            self._ns_queues[identity.namespace_id] = cached
        return sorted(identity.queue_ids | cached[1])

    def _claim(
        self,
        conn: Connection,
        identity: Identity,
        limit: int,
        now: dt.datetime,
        mono: float,
        batched: bool,
        log: list[LogEntry],
    ) -> tuple[list[Owned], int, int]:
        """Claim up to ``limit`` due rows of the identity's namespace (inside the caller's
        transaction). Returns (claimed rows, due rows seen, rows moved to REVIEW by the guards).

        Rows of queues the credential does not allow are claimed too: the check before sending
        moves them to REVIEW ``QUEUE_FORBIDDEN`` (SPEC §8 step 3) instead of letting them wait
        silently for their deadline."""
        queues = self._claim_queues(conn, identity)
        if not queues or limit <= 0:
            return [], 0, 0
        start = self._queue_offset % len(queues)
        self._queue_offset += 1
        claimed: list[claims.Claimed] = []
        seen = guarded = 0
        # Holds recorded by any sender process (sender_holds), and this process's own.
        held = holds.held_queues(conn, identity.namespace_id, now)
        for queue in queues[start:] + queues[:start]:
            if len(claimed) >= limit:
                break
            if queue in held or self.held(identity.namespace_id, queue):
                continue  # the platform asked this queue to wait: claim nothing of it
            ready: list[claims.Candidate] = []
            for cand in claims.due_candidates(
                conn, identity.namespace_id, queue, now, limit - len(claimed)
            ):
                seen += 1
                code = policy.claim_guard(
                    now, cand.send_count, cand.send_deadline_at, self.timeout_seconds
                )
                if code is None:
                    ready.append(cand)
                elif claims.guard_to_review(conn, cand, code, now):
                    guarded += 1
                    fields = dict(
                        namespace_id=cand.namespace_id,
                        operation_id=cand.operation_id,
                        code=code,
                        send_count=cand.send_count,
                    )
                    log.append(("sender.row.review", logging.INFO, fields))
            if batched:
                if not claims.claim_many(conn, ready, now, self.lease_seconds):
                    raise BatchRaced()
            else:
                ready = [c for c in ready if claims.claim(conn, c, now, self.lease_seconds)]
            claimed += [claims.claimed_row(c, now, self.lease_seconds) for c in ready]
        if claimed:
            failpoints.hit("sender.claim.before_commit")
        return [Owned(r, mono) for r in claimed], seen, guarded

    def claim_batch(self, identity: Identity, limit: int) -> tuple[list[Owned], int, int]:
        """Claim up to ``limit`` due rows in one transaction of its own (see :meth:`_claim`)."""
        log: list[LogEntry] = []

        def run(conn: Connection, batched: bool) -> tuple[list[Owned], int, int]:
            log.clear()
            # Read before the clock: the time since ``mono`` is never less than the time since
            # ``now`` (the deadline and lease checks before the POST rely on it).
            mono = self.monotonic()
            return self._claim(conn, identity, limit, self.clock.now(conn), mono, batched, log)

        got = self._transaction(run)
        _flush(log)
        return got

    # --- one row: checks and the HTTP exchange (sending threads) -------------------------------

    def send(self, owned: Owned, pass_end: float = math.inf) -> Sent:
        """Check one claimed row and POST it, unless the exchange could not end by ``pass_end``
        (monotonic seam) or the checks say no. Never touches the database."""
        row = owned.row
        need = self.timeout_seconds * (1 if self.client.identity_is_fresh() else 2)
        if self.monotonic() + need > pass_end:
            return Sent(owned, SendAction.RELEASE, reason=ReleaseReason.PASS_END)
        if shutdown.requested():  # the worker is shutting down: another sender sends it now
            return Sent(owned, SendAction.RELEASE, reason=ReleaseReason.SHUTDOWN)
        if self.held(row.namespace_id, row.queue_id):
            return Sent(owned, SendAction.RELEASE, reason=ReleaseReason.QUEUE_HELD)
        try:
            identity = self.client.identity()
        except IdentityUnavailable:
            return Sent(owned, SendAction.RELEASE, reason=ReleaseReason.IDENTITY_UNAVAILABLE)
        check = policy.presend_check(
            stored_digest=row.request_digest,
            request_json=row.request_json,
            operation_id=row.operation_id,
            key=row.idempotency_key,
            row_namespace=row.namespace_id,
            row_queue=row.queue_id,
            identity_namespace=identity.namespace_id,
            identity_queues=identity.queue_ids,
        )
        if isinstance(check, ReleaseReason):
            # The credential now belongs to another namespace: never send this row with it.
            return Sent(owned, SendAction.RELEASE, reason=check)
        if check is not None:
            return Sent(owned, SendAction.REVIEW, code=check)
        elapsed = dt.timedelta(seconds=self.monotonic() - owned.mono)
        if policy.too_late_to_send(
            row.claimed_at + elapsed, row.send_deadline_at, self.timeout_seconds
        ):
            return Sent(owned, SendAction.REVIEW, code=LastCode.DEADLINE_EXCEEDED)
        if row.claimed_at + elapsed + dt.timedelta(seconds=self.timeout_seconds) >= row.lease_until:
            # Too little lease left for one bounded send: give it back unsent.
            return Sent(owned, SendAction.RELEASE, reason=ReleaseReason.LEASE_SHORT)
        started = time.perf_counter()
        result = self.client.submit(
            row.namespace_id, row.queue_id, row.idempotency_key, row.request_json.encode("utf-8")
        )
        counters.HTTP_SECONDS.observe(time.perf_counter() - started)
        if result.status in (401, 403):
            self.client.invalidate_identity()
        if result.status in HOLD_STATUSES:
            now = row.claimed_at + dt.timedelta(seconds=self.monotonic() - owned.mono)
            wait = policy.parse_retry_after(result.retry_after, now)
            if wait:
                # At once for this process's other sending threads; the pass's thread bounds it
                # and records it for every process when it writes this outcome (_record_hold).
                self.hold(row.namespace_id, row.queue_id, wait)
        return Sent(owned, SendAction.SENT, result=result)

    # --- queue-wide back-off -------------------------------------------------------------------

    def held(self, namespace_id: str, queue_id: str) -> bool:
        """Whether a Retry-After of this (namespace, queue) is still running in this process."""
        with self._holds_lock:
            until = self._holds.get((namespace_id, queue_id))
        return until is not None and self.monotonic() < until

    def hold(
        self, namespace_id: str, queue_id: str, seconds: float, *, replace: bool = False
    ) -> None:
        """Hold every send to (namespace, queue) in this process for ``seconds`` (a 429 or 503
        with ``Retry-After``): the rest of that queue waits with the row that was told so,
        instead of hitting a platform that asked everyone to wait; other queues keep flowing.
        ``replace``: set this end even when it is earlier (the bounded, recorded hold)."""
        until = self.monotonic() + seconds
        with self._holds_lock:
            key = (namespace_id, queue_id)
            if not replace and until <= self._holds.get(key, -math.inf):
                return
            self._holds[key] = until

    def _record_hold(
        self, conn: Connection, sent: Sent, outcome: policy.Outcome, now: dt.datetime
    ) -> None:
        """A 429/503 with ``Retry-After``: the hold of its queue, bounded by the documented
        maximum and by the last retry slot of the queue's earliest deadline, recorded in
        ``sender_holds`` for every sender process (and this process's own hold set to it)."""
        row, result = sent.owned.row, sent.result
        if result is None or result.status not in HOLD_STATUSES or not outcome.retry_after:
            return
        earliest = holds.earliest_open_deadline(conn, row.namespace_id, row.queue_id)
        if earliest is None or row.send_deadline_at < earliest:
            earliest = row.send_deadline_at
        until = policy.hold_until(now, outcome.retry_after, earliest, self.timeout_seconds)
        seconds = 0.0 if until is None else (until - now).total_seconds()
        self.hold(row.namespace_id, row.queue_id, seconds, replace=True)
        if until is None:
            return
        holds.write_hold(
            conn,
            row.namespace_id,
            row.queue_id,
            until=until,
            status=result.status,
            asked_seconds=outcome.retry_after,
            now=now,
        )
        log_action(
            logger, "sender.queue.held", namespace_id=row.namespace_id, queue_id=row.queue_id,
            seconds=round(seconds, 3), asked_seconds=outcome.retry_after, status=result.status,
            until=format_ts(until),
        )  # fmt: skip

    # --- one row: the fenced outcome write (the pass's thread) ---------------------------------

    @staticmethod
    def _classify(sent: Sent, now: dt.datetime) -> policy.Outcome:
        """The outcome of one HTTP result (SPEC §8 step 4)."""
        row, result = sent.owned.row, sent.result
        assert result is not None
        if result.status is None:
            assert result.transport is not None
            return policy.classify_transport(result.transport)
        return policy.classify_response(
            result.status,
            result.body,
            namespace_id=row.namespace_id,
            queue_id=row.queue_id,
            key=row.idempotency_key,
            retry_after=policy.parse_retry_after(result.retry_after, now),
        )

    def _write_outcome(
        self, conn: Connection, sent: Sent, now: dt.datetime, fields: dict[str, Any]
    ) -> tuple[LastCode, RowResult, bool]:
        """Classify one HTTP result and write it: (code, kind, written)."""
        row = sent.owned.row
        outcome = self._classify(sent, now)
        if outcome.kind == OutcomeKind.ACCEPTED:
            assert outcome.task_id is not None and outcome.receipt_json is not None
            fields["task_id"] = outcome.task_id
            written = outcomes.write_accepted(conn, row, outcome.task_id, outcome.receipt_json, now)
            return outcome.code, RowResult.ACCEPTED, written
        code = outcome.code
        if outcome.kind == OutcomeKind.RETRY:
            self._record_hold(conn, sent, outcome, now)
            wake, final = policy.after_retryable(
                now,
                row.send_deadline_at,
                row.send_count,
                self.rng,
                outcome.retry_after,
                self.timeout_seconds,
            )
            if wake is not None:
                return code, RowResult.RETRY, outcomes.write_retry(conn, row, code, wake, now)
            assert final is not None
            code = final
        return code, RowResult.REVIEW, outcomes.write_review(conn, row, code, now)

    def record(
        self,
        conn: Connection,
        sent: Sent,
        now: dt.datetime,
        log: list[LogEntry],
        sends: list[SendCount] | None = None,
    ) -> RowResult:
        """Write what happened to one row, fenced by its epoch; returns the stats label. A POST's
        outcome is appended to ``sends`` (counted after the commit)."""
        row = sent.owned.row
        sends = [] if sends is None else sends
        fields = _fields(row)
        status = None if sent.result is None else sent.result.status
        if sent.action == SendAction.ERROR:
            return RowResult.ERROR  # nothing to write: the row is taken over after its lease
        code: LastCode | Literal[""]
        if sent.action == SendAction.RELEASE:
            if outcomes.release(conn, row, now):
                entry = {"reason": sent.reason, **fields}
                log.append(("sender.row.released", logging.INFO, entry))
                return RowResult.RELEASED
            code = ""
        else:
            if sent.action == SendAction.REVIEW:
                assert sent.code
                code, kind = sent.code, RowResult.REVIEW
                written = outcomes.write_review(conn, row, code, now)
            else:
                code, kind, written = self._write_outcome(conn, sent, now, fields)
            if written:
                extra: dict[str, Any] = {"code": code}
                if sent.result is not None:
                    extra["status"] = status
                    sends.append((code, _lag(row, now) if kind == RowResult.ACCEPTED else None))
                log.append((f"sender.row.{kind}", logging.INFO, {**extra, **fields}))
                return kind
            if sent.result is not None:
                sends.append((Dropped.STALE, None))
        log.append(
            ("sender.outcome.stale", logging.WARNING, {"code": code, "status": status, **fields})
        )
        return RowResult.STALE

    def record_all(
        self,
        conn: Connection,
        sents: list[Sent],
        now: dt.datetime,
        batched: bool,
        log: list[LogEntry],
        sends: list[SendCount] | None = None,
    ) -> list[RowResult]:
        """:meth:`record` for several rows; with ``batched`` the accepted ones of a namespace
        share two statements (raises :class:`BatchRaced` when one of them was stale)."""
        sends = [] if sends is None else sends
        labels: list[RowResult] = []
        accepted: dict[str, list[tuple[Sent, policy.Outcome]]] = {}
        for sent in sents:
            if batched and sent.action == SendAction.SENT:
                outcome = self._classify(sent, now)
                if outcome.kind == OutcomeKind.ACCEPTED:
                    accepted.setdefault(sent.owned.row.namespace_id, []).append((sent, outcome))
                    continue
            labels.append(self.record(conn, sent, now, log, sends))
        for group in accepted.values():
            items = [(s.owned.row, str(oc.task_id), str(oc.receipt_json)) for s, oc in group]
            if not outcomes.write_accepted_many(conn, items, now):
                raise BatchRaced()
            for sent, outcome in group:
                assert sent.result is not None
                fields = dict(code=outcome.code, status=sent.result.status, task_id=outcome.task_id)
                log.append(
                    ("sender.row.accepted", logging.INFO, {**fields, **_fields(sent.owned.row)})
                )
                sends.append((LastCode.ACCEPTED, _lag(sent.owned.row, now)))
                labels.append(RowResult.ACCEPTED)
        return labels

    def process(self, owned: Owned) -> RowResult:
        """Check, send and record one claimed row on its own. Returns the stats label."""
        try:
            sent = self.send(owned)
            log: list[LogEntry] = []
            sends: list[SendCount] = []

            def run(conn: Connection, _batched: bool) -> RowResult:
                log.clear()
                sends.clear()
                return self.record(conn, sent, self.clock.now(conn), log, sends)

            label = self._transaction(run)
            _flush(log, sends)
            return label
        except Exception as exc:  # noqa: BLE001 - one bad row must not stop the pass
            self._row_error(owned, exc)
            return RowResult.ERROR

    def _row_error(self, owned: Owned, exc: BaseException) -> None:
        error = type(exc).__name__
        log_action(logger, "sender.row.error", logging.ERROR, error=error, **_fields(owned.row))

    # --- the pass ------------------------------------------------------------------------------

    def run_pass(self, *, max_claims: int = 1000, budget_seconds: float | None = None) -> PassStats:
        """Claim and send due rows until none are due, ``max_claims`` were claimed or the claim
        budget is spent; then finish the rows in flight. No HTTP exchange runs later than
        ``budget + 2 * timeout`` after the start (a row that would is released unsent), so a pass
        ends on its own within the limits of orbit_tasks/sender_limits.py."""
        stats = PassStats()
        start = self.monotonic()
        claim_end = start + (DEFAULT_CLAIM_SECONDS if budget_seconds is None else budget_seconds)
        pass_end = claim_end + 2 * self.timeout_seconds
        # The sweep needs no credential: rows past their deadline go to REVIEW even when no
        # sender can claim them (platform down, token revoked, namespace without a sender).
        if self._last_sweep is None or start - self._last_sweep >= SWEEP_INTERVAL_SECONDS:
            self._last_sweep = start
            stats.swept = self.sweep()
        try:
            self.client.identity()
        except IdentityUnavailable as exc:
            stats.identity_error = True
            self._identity_unavailable(exc)
            return stats
        # Claim a page once that many rows are recorded; up to a window of rows is claimed and
        # not yet recorded, so sending threads always find queued rows while this thread writes
        # outcomes and claims (one commit per page; measured in bench/sender_throughput.py).
        page = PAGE_PER_THREAD * self.concurrency
        window = WINDOW_PER_THREAD * self.concurrency
        done = Finished()
        ready: list[Sent] = []  # sends finished, outcome not yet written
        pending = 0  # rows claimed and not yet recorded (ready ones included)
        drained = False
        with (
            self.engine.connect() as conn,
            ThreadPoolExecutor(self.concurrency, thread_name_prefix="orbit-sender") as pool,
        ):
            while True:
                ready += done.take(0)
                left = max_claims - stats.claimed
                room = min(window - pending + len(ready), left)
                claiming = not drained and left > 0 and self.monotonic() < claim_end
                # a worker shutting down (SIGTERM) claims no more: the pass finishes the sends in
                # flight, releases the rest and ends (docs/operations.md "Rolling restarts")
                claiming = claiming and not shutdown.requested()
                identity: Identity | None = None
                if claiming and room >= min(page, left):
                    # The identity as it is now (cached <= 60 s, dropped after a 401/403): a
                    # credential lost mid-pass stops the claiming; otherwise every release
                    # (identity unavailable) would be claimed again at once, one send each time.
                    try:
                        identity = self.client.identity()
                    except IdentityUnavailable as exc:
                        stats.identity_error = drained = True
                        claiming = False
                        self._identity_unavailable(exc)
                    if self.monotonic() >= claim_end:  # the refresh itself took the rest
                        identity, claiming = None, False
                # While claiming goes on, outcomes wait for the next claim step (a page of them
                # shares one commit); afterwards they are written as they come.
                if identity is not None or (ready and not claiming):
                    owned, seen = self._step(conn, ready, identity, room, stats)
                    pending += len(owned) - len(ready)
                    ready = []
                    stats.claimed += len(owned)
                    if identity is not None and seen == 0:
                        drained = True
                    for item in owned:
                        pool.submit(self._send_to, done, item, pass_end)
                    continue
                if pending == 0:
                    break
                # Sleep until a page can be claimed (room grows by one per finished send; the
                # rows in flight always suffice), or until one outcome can be written.
                ready += done.take(max(1, min(page, left) - room) if claiming else 1)
        stats.more = not drained
        log_action(logger, "sender.pass.done", **stats.as_fields())
        return stats

    def _identity_unavailable(self, exc: IdentityUnavailable) -> None:
        """One WARNING line naming why and the API URL (its password hidden)."""
        log_action(
            logger,
            "sender.identity.unavailable",
            logging.WARNING,
            reason=str(exc),
            api_url=self.client.shown_url,
        )

    def _send_to(self, done: Finished, owned: Owned, pass_end: float) -> None:
        """A sending thread: :meth:`send`, then hand the result to the pass's thread."""
        try:
            done.put(self.send(owned, pass_end))
        except Exception as exc:  # noqa: BLE001 - the row is taken over after its lease
            self._row_error(owned, exc)
            done.put(Sent(owned, SendAction.ERROR))

    def _step(
        self,
        conn: Connection,
        sents: list[Sent],
        identity: Identity | None,
        room: int,
        stats: PassStats,
    ) -> tuple[list[Owned], int]:
        """One transaction: the outcomes of the finished sends, then (with an identity) the
        next page of claims. Returns (claimed rows, due rows seen)."""
        log: list[LogEntry] = []
        sends: list[SendCount] = []

        def run(c: Connection, batched: bool) -> tuple[list[RowResult], list[Owned], int, int]:
            log.clear()
            sends.clear()
            mono = self.monotonic()
            now = self.clock.now(c)
            labels = self.record_all(c, sents, now, batched, log, sends)
            if identity is None:
                return labels, [], 0, 0
            owned, seen, guarded = self._claim(c, identity, room, now, mono, batched, log)
            return labels, owned, seen, guarded

        labels, owned, seen, guarded = self._in_transaction(conn, run)
        _flush(log, sends)
        for label in labels:
            stats.add(label)
        stats.guarded += guarded
        return owned, seen
