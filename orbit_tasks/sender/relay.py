"""One relay pass (SPEC §8): identity, deadline sweep, claim due rows in small batches, send them
concurrently, write fenced outcomes. A stale sender's result is dropped and logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from orbit_tasks.db.engine import db_now
from orbit_tasks.db.faults import is_lock_conflict
from orbit_tasks.logs import log_action
from orbit_tasks.sender import policy, store
from orbit_tasks.sender.client import Identity, IdentityUnavailable, PlatformClient

logger = logging.getLogger("orbit.sender")

SWEEP_LIMIT = 500
# The claim guards catch due rows of claimable queues at once; the sweep is for the rest (rows no
# credential can claim), so once per interval per process is enough and keeps big backlogs cheap.
SWEEP_INTERVAL_SECONDS = 30.0
QUEUE_SCAN_SECONDS = 10.0  # how often the namespace's queues with outbox rows are re-read
T = TypeVar("T")
Clock = Callable[[Connection], dt.datetime]


@dataclass
class PassStats:
    claimed: int = 0
    guarded: int = 0  # due rows moved to REVIEW by the claim guards
    swept: int = 0  # rows moved to REVIEW DEADLINE_EXCEEDED by the sweep
    results: dict[str, int] = field(default_factory=dict)
    identity_error: bool = False
    more: bool = False  # stopped by the pass budget with due rows left

    def add(self, result: str) -> None:
        self.results[result] = self.results.get(result, 0) + 1

    def as_fields(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "guarded": self.guarded,
            "swept": self.swept,
            "identity_error": self.identity_error,
            "more": self.more,
            **{f"n_{k}": v for k, v in sorted(self.results.items())},
        }


@dataclass(frozen=True)
class Owned:
    row: store.Claimed
    mono: float  # time.monotonic() just before the claim's database clock was read


def _with_db_retry(engine: Engine, fn: Callable[[Connection], T], attempts: int = 3) -> T:
    """Run ``fn`` in one transaction; retry a deadlock / lock wait timeout a few times."""
    for attempt in range(attempts):
        try:
            with engine.begin() as conn:
                return fn(conn)
        except OperationalError as exc:
            if not is_lock_conflict(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")


class Relay:
    """Sends due outbox rows of the credential's namespace. One per process is enough."""

    def __init__(
        self,
        engine: Engine,
        client: PlatformClient,
        *,
        lease_seconds: int,
        timeout_seconds: float,
        concurrency: int,
        rng: policy.RandomSource | None = None,
        clock: Clock = db_now,
    ) -> None:
        self.engine = engine
        self.client = client
        self.lease_seconds = lease_seconds
        self.timeout_seconds = timeout_seconds
        self.concurrency = max(1, concurrency)
        self.rng = rng or random.SystemRandom()
        self.clock = clock
        self._queue_offset = 0
        self._ns_queues: dict[str, tuple[float, frozenset[str]]] = {}
        self._last_sweep: float | None = None

    # --- claiming ------------------------------------------------------------------------------

    def sweep(self) -> int:
        def run(conn: Connection) -> int:
            return store.sweep_deadlines(conn, self.clock(conn), SWEEP_LIMIT)

        moved = _with_db_retry(self.engine, run)
        if moved:
            log_action(logger, "sender.sweep.deadline_exceeded", rows=moved)
        return moved

    def _claim_queues(self, identity: Identity) -> list[str]:
        """The allowed queues plus every queue of the namespace that has outbox rows (the
        latter re-read at most every QUEUE_SCAN_SECONDS)."""
        cached = self._ns_queues.get(identity.namespace_id)
        if cached is None or time.monotonic() - cached[0] >= QUEUE_SCAN_SECONDS:
            found = _with_db_retry(
                self.engine, lambda c: store.namespace_queues(c, identity.namespace_id)
            )
            cached = (time.monotonic(), frozenset(found))
            self._ns_queues[identity.namespace_id] = cached
        return sorted(identity.queue_ids | cached[1])

    def claim_batch(self, identity: Identity, limit: int) -> tuple[list[Owned], int, int]:
        """Claim up to ``limit`` due rows of the identity's namespace in one transaction.
        Returns (claimed rows, due rows seen, rows moved to REVIEW by the guards).

        Rows of queues the credential does not allow are claimed too: the check before sending
        moves them to REVIEW ``QUEUE_FORBIDDEN`` (SPEC §8 step 3) instead of letting them wait
        silently for their deadline."""
        queues = self._claim_queues(identity)
        if not queues or limit <= 0:
            return [], 0, 0
        start = self._queue_offset % len(queues)
        self._queue_offset += 1
        order = queues[start:] + queues[:start]

        def run(conn: Connection) -> tuple[list[Owned], int, int]:
            # Taken before the clock is read: the time since ``mono`` is never less than the
            # time since ``now`` (the deadline/lease checks before the POST rely on it).
            mono = time.monotonic()
            now = self.clock(conn)
            claims: list[tuple[store.Candidate, int]] = []
            seen = guarded = 0
            for queue in order:
                if len(claims) >= limit:
                    break
                for cand in store.due_candidates(
                    conn, identity.namespace_id, queue, now, limit - len(claims)
                ):
                    seen += 1
                    code = policy.claim_guard(now, cand.send_count, cand.send_deadline_at)
                    if code is not None:
                        if store.guard_to_review(conn, cand, code, now):
                            guarded += 1
                            log_action(
                                logger,
                                "sender.row.review",
                                namespace_id=cand.namespace_id,
                                operation_id=cand.operation_id,
                                code=code,
                                send_count=cand.send_count,
                            )
                    elif store.claim(conn, cand, now, self.lease_seconds):
                        claims.append((cand, cand.lease_epoch + 1))
            rows = store.load_claimed(conn, claims, now, self.lease_seconds) if claims else []
            return [Owned(r, mono) for r in rows], seen, guarded

        return _with_db_retry(self.engine, run)

    # --- one row -------------------------------------------------------------------------------

    def _write(self, owned: Owned, fn: Callable[[Connection, dt.datetime], bool]) -> bool:
        return _with_db_retry(self.engine, lambda conn: fn(conn, self.clock(conn)))

    def process(self, owned: Owned) -> str:
        """Check, send and record one claimed row. Returns a result label for the stats."""
        row = owned.row
        fields: dict[str, Any] = dict(
            namespace_id=row.namespace_id,
            operation_id=row.operation_id,
            queue_id=row.queue_id,
            epoch=row.lease_epoch,
            send_count=row.send_count,
        )
        try:
            return self._process(owned, fields)
        except Exception as exc:  # noqa: BLE001 - one bad row must not stop the pass
            log_action(
                logger, "sender.row.error", logging.ERROR, error=type(exc).__name__, **fields
            )
            return "error"

    def _process(self, owned: Owned, fields: dict[str, Any]) -> str:
        row = owned.row
        try:
            identity = self.client.identity()
        except IdentityUnavailable:
            self._write(owned, lambda c, now: store.release(c, row, now))
            return "released"
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
        if check == "":
            # The credential now belongs to another namespace: never send this row with it.
            self._write(owned, lambda c, now: store.release(c, row, now))
            log_action(logger, "sender.row.released", reason="other_namespace", **fields)
            return "released"
        if check is not None:
            return self._review(owned, check, fields)
        elapsed = dt.timedelta(seconds=time.monotonic() - owned.mono)
        if policy.too_late_to_send(row.claimed_at + elapsed, row.send_deadline_at):
            return self._review(owned, policy.DEADLINE_EXCEEDED, fields)
        if row.claimed_at + elapsed + dt.timedelta(seconds=self.timeout_seconds) >= row.lease_until:
            # Too little lease left for one bounded send: give it back unsent.
            self._write(owned, lambda c, now: store.release(c, row, now))
            log_action(logger, "sender.row.released", reason="lease_short", **fields)
            return "released"

        result = self.client.submit(
            row.namespace_id, row.queue_id, row.idempotency_key, row.request_json.encode("utf-8")
        )

        def record(conn: Connection, now: dt.datetime) -> tuple[bool, policy.Outcome]:
            if result.status is None:
                assert result.transport is not None
                outcome = policy.classify_transport(result.transport)
            else:
                outcome = policy.classify_response(
                    result.status,
                    result.body,
                    namespace_id=row.namespace_id,
                    queue_id=row.queue_id,
                    key=row.idempotency_key,
                    retry_after=policy.parse_retry_after(result.retry_after, now),
                )
            if outcome.kind == "accepted":
                assert outcome.task_id is not None and outcome.receipt_json is not None
                ok = store.write_accepted(conn, row, outcome.task_id, outcome.receipt_json, now)
                return ok, outcome
            if outcome.kind == "retry":
                wake, final = policy.after_retryable(
                    now, row.send_deadline_at, row.send_count, self.rng, outcome.retry_after
                )
                if wake is not None:
                    return store.write_retry(conn, row, outcome.code, wake, now), outcome
                assert final is not None
                outcome = policy.Outcome("review", final)
            return store.write_review(conn, row, outcome.code, now), outcome

        written, outcome = _with_db_retry(self.engine, lambda c: record(c, self.clock(c)))
        if result.status in (401, 403):
            self.client.invalidate_identity()
        if not written:
            log_action(
                logger,
                "sender.outcome.stale",
                logging.WARNING,
                code=outcome.code,
                status=result.status,
                **fields,
            )
            return "stale"
        extra: dict[str, Any] = {"code": outcome.code, "status": result.status}
        if outcome.kind == "accepted":
            extra["task_id"] = outcome.task_id
        log_action(logger, f"sender.row.{outcome.kind}", **extra, **fields)
        return outcome.kind

    def _review(self, owned: Owned, code: str, fields: dict[str, Any]) -> str:
        if self._write(owned, lambda c, now: store.write_review(c, owned.row, code, now)):
            log_action(logger, "sender.row.review", code=code, **fields)
            return "review"
        log_action(logger, "sender.outcome.stale", logging.WARNING, code=code, **fields)
        return "stale"

    # --- the pass ------------------------------------------------------------------------------

    def run_pass(self, *, max_claims: int = 1000, budget_seconds: float = 20.0) -> PassStats:
        """Claim and send due rows until none are due, ``max_claims`` were claimed or the time
        budget is spent; then wait for the rows in flight."""
        stats = PassStats()
        # The sweep needs no credential: rows past their deadline go to REVIEW even when no
        # sender can claim them (platform down, token revoked, namespace without a sender).
        mono = time.monotonic()
        if self._last_sweep is None or mono - self._last_sweep >= SWEEP_INTERVAL_SECONDS:
            self._last_sweep = mono
            stats.swept = self.sweep()
        try:
            identity = self.client.identity()
        except IdentityUnavailable as exc:
            stats.identity_error = True
            log_action(logger, "sender.identity.unavailable", logging.WARNING, reason=str(exc))
            return stats
        started = time.monotonic()
        batch = self.concurrency
        inflight: set[Future[str]] = set()
        drained = False
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="orbit-sender") as pool:
            while True:
                in_budget = time.monotonic() - started < budget_seconds
                room = min(2 * self.concurrency - len(inflight), max_claims - stats.claimed)
                if not drained and in_budget and room >= min(batch, max_claims - stats.claimed) > 0:
                    # The identity as it is now (cached <= 60 s, dropped after a 401/403): a
                    # credential lost mid-pass stops the claiming; otherwise every release
                    # (identity unavailable) would be claimed again at once, one send each time.
                    try:
                        identity = self.client.identity()
                    except IdentityUnavailable as exc:
                        stats.identity_error = True
                        drained = True
                        log_action(
                            logger,
                            "sender.identity.unavailable",
                            logging.WARNING,
                            reason=str(exc),
                        )
                        continue
                    owned, seen, guarded = self.claim_batch(identity, room)
                    stats.guarded += guarded
                    stats.claimed += len(owned)
                    if seen == 0:
                        drained = True
                    for item in owned:
                        inflight.add(pool.submit(self.process, item))
                    continue
                if not inflight:
                    break
                done, inflight = wait(inflight, return_when=FIRST_COMPLETED)
                for fut in done:
                    stats.add(fut.result())
        stats.more = not drained
        log_action(logger, "sender.pass.done", **stats.as_fields())
        return stats
