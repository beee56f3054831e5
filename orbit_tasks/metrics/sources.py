"""The exporter's two database sources: read everything one refresh needs, in one snapshot.

Each read runs in one REPEATABLE READ transaction on MySQL/MariaDB, so all counts of a refresh
come from the same consistent view (a job finishing between two statements is counted once).
Time comparisons use the database clock (SPEC §2), read in the same transaction. Connections
are bounded in time (docs/metrics.md "Time bounds"): connect/read/write timeouts in the driver
and a server-side statement limit; the collector adds its own deadline on top.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import make_url

from orbit_tasks.archive.jobs import JobFailure, JobState
from orbit_tasks.archive.store import controls as control_store
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.beat import store as beat_store
from orbit_tasks.db.engine import FixedClock, db_now, is_mysql, make_engine
from orbit_tasks.metrics import store
from orbit_tasks.metrics.families import (
    NEAR_DEADLINE,
    BeatReading,
    BusinessReading,
    PlanBacklog,
    PlatformReading,
    backlog_roots,
)
from orbit_tasks.sender.policy import OutboxState

# Terminal jobs (SUCCEEDED, ABANDONED) never change again: counts up to a cut are recounted
# with a scan of the jobs table only every RECOUNT_SECONDS, and each refresh adds the jobs that
# finished after the cut (an index range). The cut trails the database clock by SETTLE_SECONDS:
# a job's updated_at is read inside the transaction that finishes it, so a job could otherwise
# commit after a recount with an updated_at before the cut and be missed until the next recount.
RECOUNT_SECONDS = 600.0
SETTLE_SECONDS = 300
# Plan backlogs (issue 25 item 4): each plan is probed again once its value is BACKLOG_SECONDS
# old, on its kind's settled index up to BACKLOG_CAP + 1 entries (families.backlog_roots
# extrapolates beyond the cap); a refresh spends at most BACKLOG_BUDGET_SECONDS on probes.
BACKLOG_SECONDS = 60.0
BACKLOG_BUDGET_SECONDS = 1.0
BACKLOG_CAP = 100_000
#: Sorts after every job id: the backlog starts after every SUCCEEDED job created until now.
_AFTER_EVERY_JOB = b"\xff" * 16


def bounded_engine(url: str, timeout: float) -> Engine:
    """An engine whose connections give up: connect/read/write timeouts (whole seconds in the
    driver) and a per-statement limit on the server (MariaDB ``max_statement_time``, MySQL
    ``max_execution_time``), both derived from ``timeout``."""
    if make_url(url).get_backend_name() not in ("mysql", "mariadb"):
        return make_engine(url)
    seconds = max(1, math.ceil(timeout))
    engine = make_engine(
        url,
        connect_args={
            "connect_timeout": seconds,
            "read_timeout": seconds + 1,
            "write_timeout": seconds + 1,
        },
        pool_size=2,
        max_overflow=2,
        pool_timeout=timeout,
    )

    @event.listens_for(engine, "connect")
    def _statement_limit(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        if "MariaDB" in dbapi_conn.get_server_info():
            cur.execute(f"SET SESSION max_statement_time = {timeout:.3f}")
        else:
            cur.execute(f"SET SESSION max_execution_time = {int(timeout * 1000)}")
        cur.close()

    return engine


@contextmanager
def snapshot_connection(engine: Engine) -> Any:
    """One read-only transaction with a consistent view (REPEATABLE READ on MySQL/MariaDB)."""
    with engine.connect() as conn:
        if is_mysql(conn):
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


@dataclass
class _Tally:
    cut: dt.datetime
    counted_at: float  # monotonic clock of the recount
    counts: dict[store.JobKey, store.Totals]


class PlatformSource:
    """Archive jobs, plans and storages from the platform database."""

    name = "platform_db"

    def __init__(
        self,
        engine: Engine,
        *,
        tick_seconds: int,
        clock: Callable[[], float] = time.monotonic,
        recount_seconds: float = RECOUNT_SECONDS,
        settle_seconds: int = SETTLE_SECONDS,
    ) -> None:
        self.engine = engine
        self.tick_seconds = tick_seconds
        self.clock = clock
        self.recount_seconds = recount_seconds
        self.settle = dt.timedelta(seconds=settle_seconds)
        self._tally: _Tally | None = None
        self.recounts = 0
        # (namespace id, kind) -> (when probed, its backlog; None: no range)
        self._probed: dict[tuple[bytes, str], tuple[float, PlanBacklog | None]] = {}
        self.backlog_seconds = BACKLOG_SECONDS
        self.backlog_budget = BACKLOG_BUDGET_SECONDS
        self.backlog_cap = BACKLOG_CAP

    def read(
        self, on_storages: Callable[[tuple[bytes, ...]], None] | None = None
    ) -> PlatformReading:
        """One refresh. ``on_storages`` gets the registered storages as soon as they are known
        (the broker probe needs them for the queue names)."""
        with snapshot_connection(self.engine) as conn:
            now = db_now(conn)
            registered = store.registered_storages(conn)
            storages = tuple(registered.live)
            if on_storages is not None:
                on_storages(storages)
            tally = self._terminal_tally(conn, now)
            recent = (
                store.terminal_counts(conn, store.terminal_since_query(storages, tally.cut))
                if storages
                else {}
            )
            active = store.active_jobs(conn, storages, now)
            overdue = store.overdue_plans(
                conn, storages, now - dt.timedelta(seconds=2 * self.tick_seconds)
            )
            waiting = control_store.waiting_counts(conn)
            backlogs = self._plan_backlogs(conn, now)
            beat = _beat_reading(conn, now)
            names = store.namespace_names(conn)
        reading = _assemble(now, storages, tally.counts, recent, active, overdue)
        return replace(
            reading, waiting=waiting, backlogs=backlogs, storage_labels=registered.live,
            namespace_names=names, retired=registered.retired, beat=beat,
        )  # fmt: skip

    def _plan_backlogs(self, conn: Connection, now: dt.datetime) -> tuple[PlanBacklog, ...]:
        """Every enabled plan's backlog: the range a job created now would have (its ``from`` =
        the greatest archived end, SPEC §5), probed on the kind's settled index up to
        ``backlog_cap + 1`` roots. A plan is probed again once its value is ``backlog_seconds``
        old, the oldest first, and one refresh spends at most ``backlog_budget`` seconds on
        probes (at least one): a fleet of many plans is probed over several refreshes, never
        past the exporter's deadline. A plan whose policy revision row is gone is left out."""
        plans = store.enabled_plans(conn)
        enabled = {(p.namespace_id, p.kind) for p in plans}
        self._probed = {k: v for k, v in self._probed.items() if k in enabled}
        started = self.clock()
        for i, plan in enumerate(sorted(plans, key=self._probe_age)):
            key = (plan.namespace_id, plan.kind)
            if key in self._probed and started - self._probed[key][0] < self.backlog_seconds:
                break  # the rest are fresher still
            if i > 0 and self.clock() - started >= self.backlog_budget:
                break
            self._probed[key] = (self.clock(), self._probe(conn, plan, now))
        found = (self._probed.get((p.namespace_id, p.kind)) for p in plans)
        return tuple(b for f in found if f is not None and (b := f[1]) is not None)

    def _probe_age(self, plan: store.PlanRow) -> float:
        """When the plan was probed last (never: first of all)."""
        return self._probed.get((plan.namespace_id, plan.kind), (-math.inf, None))[0]

    def _probe(self, conn: Connection, plan: store.PlanRow, now: dt.datetime) -> PlanBacklog | None:
        try:
            rng = job_store.range_at(
                conn, plan.namespace_id, plan.kind, plan.policy_revision, now, _AFTER_EVERY_JOB
            )
        except JobFailure:
            return None
        cap = self.backlog_cap
        probe = store.backlog_probe(conn, plan.kind, plan.namespace_id, rng, cap)
        roots = backlog_roots(probe.counted, cap, probe.first, probe.last, rng.until)
        behind = 0.0 if probe.first is None else (rng.until - probe.first).total_seconds()
        return PlanBacklog(plan.namespace, plan.kind, roots, behind, plan.interval_seconds)

    def _terminal_tally(self, conn: Connection, now: dt.datetime) -> _Tally:
        tally = self._tally
        if tally is None or self.clock() - tally.counted_at >= self.recount_seconds:
            cut = now - self.settle
            counts = store.terminal_counts(conn, store.terminal_recount_query(cut))
            tally = self._tally = _Tally(cut, self.clock(), counts)
            self.recounts += 1
        return tally


def _beat_reading(conn: Connection, now: dt.datetime) -> BeatReading | None:
    """The beat leader's lease (issue 30 item 3), at the clock of this reading."""
    lease = beat_store.read(conn, FixedClock(now))
    if lease is None:
        return None
    last = lease.last_tick_at or lease.acquired_at
    return BeatReading(
        holder=lease.holder,
        epoch=int(lease.epoch),
        leading=lease.lease_until >= now,
        since_tick_seconds=max(0.0, (now - last).total_seconds()),
    )


def _assemble(
    now: dt.datetime,
    storages: tuple[bytes, ...],
    counted: dict[store.JobKey, store.Totals],
    recent: dict[store.JobKey, store.Totals],
    active: list[Any],
    overdue: dict[bytes, int],
) -> PlatformReading:
    jobs: dict[store.JobKey, int] = {}
    confirmed: dict[tuple[bytes, str], int] = {}
    roots: dict[tuple[bytes, str], int] = {}
    files: dict[tuple[bytes, str], int] = {}
    claims: dict[tuple[bytes, str], int] = {}

    def add(key: store.JobKey, t: store.Totals) -> None:
        jobs[key] = jobs.get(key, 0) + t.jobs
        pair = (key[0], key[1])
        for into, n in ((confirmed, t.bytes), (roots, t.roots), (files, t.files),
                        (claims, t.claims)):  # fmt: skip
            into[pair] = into.get(pair, 0) + n

    for part in (counted, recent):
        for key, totals in part.items():
            add(key, totals)
    failed: dict[tuple[bytes, str], int] = {}
    expired: dict[bytes, int] = {}
    pending_since: dict[bytes, dt.datetime] = {}
    for r in active:
        storage = bytes(r.storage_id)
        add((storage, r.kind, r.state), store.active_totals(r))
        if r.state == JobState.FAILED:
            failed[(storage, r.error_code)] = failed.get((storage, r.error_code), 0) + int(r.jobs)
        elif r.state == JobState.RUNNING:
            expired[storage] = expired.get(storage, 0) + int(r.expired or 0)
        elif r.state == JobState.PENDING:
            since = pending_since.get(storage)
            if since is None or r.oldest_updated_at < since:
                pending_since[storage] = r.oldest_updated_at
    return PlatformReading(
        now=now,
        storages=storages,
        jobs=jobs,
        confirmed_bytes=confirmed,
        confirmed_roots=roots,
        confirmed_files=files,
        claims=claims,
        failed=failed,
        leases_expired=expired,
        pending_since=pending_since,
        plans_overdue=overdue,
    )


class BusinessSource:
    """The outbox from the business database (only when ORBIT_SENDER_DATABASE_URL is set)."""

    name = "business_db"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def read(self) -> BusinessReading:
        with snapshot_connection(self.engine) as conn:
            now = db_now(conn)
            pairs = store.outbox_pairs(conn)
            active = store.active_outbox(conn, pairs, now + NEAR_DEADLINE) if pairs else []
            terminal = store.terminal_outbox(conn) if pairs else []
            held = {
                (h.namespace_id, h.queue_id): (h.held_until - now).total_seconds()
                for h in store.running_holds(conn, now)
            }
        rows: dict[str, int] = {}
        review: dict[str, int] = {}
        oldest: dt.datetime | None = None
        near = 0
        for r in active:
            rows[r.state] = rows.get(r.state, 0) + int(r.rows)
            near += int(r.near_deadline or 0)
            if r.oldest_created_at is not None and (oldest is None or r.oldest_created_at < oldest):
                oldest = r.oldest_created_at
        for r in terminal:
            rows[r.state] = rows.get(r.state, 0) + int(r.rows)
            if r.state == OutboxState.REVIEW:  # the dead letters: resolved rows are handled
                unresolved = int(r.rows) - int(r.resolved or 0)
                review[r.last_code] = review.get(r.last_code, 0) + unresolved
        return BusinessReading(
            now=now,
            rows=rows,
            review=review,
            oldest_active_created=oldest,
            near_deadline=near,
            holds=held,
        )
