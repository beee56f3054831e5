"""One archive tick (SPEC §7): due plans -> jobs, the replica heartbeat, then the sweep -> wake-ups.

Beat's ``orbit.archive.tick`` task and ``orbit archive tick`` both call :func:`run_tick`.

Due plans are handled a page (``DUE_PAGE``) at a time, each page in one transaction of a fixed
number of statements whatever its size (docs/archive-plans.md): the clock, the due scan, the
namespaces' states, the latest policy revisions, one compare-and-set UPDATE of the page's plans,
one multi-row INSERT of its new jobs. When another tick or an operator changed one of those plans
after the scan, the compare-and-set matches fewer rows than it wrote: the page is rolled back and
scanned again, and after ``PAGE_ATTEMPTS`` such conflicts its plans are handled one per
transaction (a page of one), so no decision is ever written over a row it did not see. Wake-ups
are published after the transactions commit; losing them only delays work until the next sweep.

Every read of the time goes through ``clock.now(conn)``, the project's one
:class:`~orbit_tasks.db.engine.Clock`: the database clock in production, a ``FixedClock`` in the
boundary tests (SPEC §2 "one clock").
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine

from orbit_tasks.archive import plans as plan_rules
from orbit_tasks.archive.controls import Scope
from orbit_tasks.archive.plans import TickAction
from orbit_tasks.archive.store import controls as control_store
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.wakeups import Publisher, publish_wakeup
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.db.faults import driver_code, is_transient_db
from orbit_tasks.errors import TransientError
from orbit_tasks.ids import new_id
from orbit_tasks.logs import log_action
from orbit_tasks.platform.store import list_storages
from orbit_tasks.redaction import redact_url
from orbit_tasks.settings import Settings
from orbit_tasks.timestamps import format_optional

log = logging.getLogger("orbit.archive.tick")


DUE_PAGE = 256  # a power of two: full pages use the compare-and-set UPDATE without padding
PAGE_ATTEMPTS = 3  # conflicting page transactions before the page's plans go one by one


@dataclass
class TickReport:
    storages: int = 0
    jobs_created: list[tuple[str, str, str]] = field(default_factory=list)  # (ns, kind, job)
    policy_unconfirmed: list[tuple[str, str]] = field(default_factory=list)  # (ns, kind)
    coalesced: list[tuple[str, str]] = field(default_factory=list)
    namespace_inactive: list[tuple[str, str]] = field(default_factory=list)
    lost: int = 0  # compare-and-set lost: another tick or an operator changed the plan first
    wakeups_published: int = 0
    paused_storages: int = 0  # storages paused as a whole: no wake-ups published for them
    now: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["now"] = format_optional(self.now)
        out["jobs_created"] = [
            {"namespace_id": ns, "kind": kind, "job_id": job} for ns, kind, job in self.jobs_created
        ]
        for key in ("policy_unconfirmed", "coalesced", "namespace_inactive"):
            out[key] = [{"namespace_id": ns, "kind": kind} for ns, kind in getattr(self, key)]
        return out


def run_tick(
    engine: Engine,
    settings: Settings,
    publish: Publisher = publish_wakeup,
    *,
    clock: Clock = DB_CLOCK,
) -> TickReport:
    """One tick. Transient database or broker faults are logged and raised as TransientError
    (nothing is half-done: committed jobs are found again by the next tick's sweep)."""
    report = TickReport()
    stage = "plans"
    try:
        with engine.connect() as conn:
            report.now = clock.now(conn)
            storages = [bytes.fromhex(s["storage_id"]) for s in list_storages(conn)]
            paused = control_store.pauses(conn)  # read once; workers check again anyway
            closed = control_store.closed_windows(conn, report.now)
        report.storages = len(storages)
        for storage_id in storages:
            _create_jobs(engine, storage_id, clock, report)
        stage = "heartbeat"
        with engine.begin() as conn:  # after the jobs: a replica showing it has them all
            plan_store.write_heartbeat(conn, clock)
        stage = "sweep"
        budget = settings.archive_wakeups_per_tick
        _sweep_and_publish(engine, storages, paused, closed, budget, publish, clock, report)
    except TransientError:
        raise
    except Exception as exc:
        if stage == "sweep" and _is_broker_error(exc):
            log_action(
                log,
                "archive.tick.failed",
                logging.WARNING,
                stage="publish",
                error=type(exc).__name__,
                jobs_created=len(report.jobs_created),
            )
            broker = f"CELERY_BROKER_URL {redact_url(settings.broker_url)!r}"  # issue 27
            raise TransientError(
                f"message broker unavailable ({type(exc).__name__}) [{broker}]; the next tick "
                "publishes again"
            ) from None
        if is_transient_db(exc):
            log_action(
                log,
                "archive.tick.failed",
                logging.WARNING,
                stage=stage,
                error=type(exc).__name__,
                code=driver_code(exc),
                jobs_created=len(report.jobs_created),
            )
            raise TransientError("database unavailable or busy; the next tick retries") from None
        raise
    log_action(
        log,
        "archive.tick.done",
        storages=report.storages,
        jobs_created=len(report.jobs_created),
        coalesced=len(report.coalesced),
        policy_unconfirmed=len(report.policy_unconfirmed),
        namespace_inactive=len(report.namespace_inactive),
        lost=report.lost,
        wakeups_published=report.wakeups_published,
    )
    return report


def _is_broker_error(exc: BaseException) -> bool:
    try:
        # Imported here: kombu (~0.04 s) only when a publish failed.
        from kombu.exceptions import OperationalError as KombuOperationalError
    except ImportError:  # pragma: no cover - kombu ships with celery
        return False
    return isinstance(exc, KombuOperationalError | OSError)  # OSError: unreachable, no folder


@dataclass(frozen=True)
class _Outcome:
    """One plan's decision; reported and logged only after its transaction committed."""

    action: TickAction
    plan: plan_store.Plan
    next_run_at: datetime | None = None
    job_id: bytes | None = None
    namespace_state: str | None = None
    latest_policy_revision: int | None = None


def _create_jobs(engine: Engine, storage_id: bytes, clock: Clock, report: TickReport) -> None:
    after: plan_store.DueCursor | None = None
    while True:
        page, outcomes, lost = _tick_page(engine, storage_id, clock, after)
        for outcome in outcomes:
            _report(outcome, report)
        report.lost += lost
        if len(page) < DUE_PAGE:
            return
        last = page[-1]
        after = (last.next_run_at, last.namespace_id, last.kind)


def _tick_page(
    engine: Engine, storage_id: bytes, clock: Clock, after: plan_store.DueCursor | None
) -> tuple[list[plan_store.Plan], list[_Outcome], int]:
    """One page of due plans after ``after``: (the plans scanned, what was committed for them,
    how many compare-and-sets were lost in the one-by-one fallback)."""
    page: list[plan_store.Plan] = []
    for attempt in range(1, PAGE_ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                now = clock.now(conn)
                page = plan_store.due_plans(conn, storage_id, now, DUE_PAGE, after)
                outcomes, writes = _decide(conn, page, now)
                plan_store.write_tick(conn, writes, now)
            return page, outcomes, 0
        except plan_store.TickConflict:
            # Rolled back: nothing of this page was written. A rescan sees the other writer's
            # committed rows (plans it advanced are no longer due).
            log_action(
                log,
                "archive.tick.page_conflict",
                storage_id=storage_id,
                plans=len(page),
                attempt=attempt,
            )
    outcomes = []
    lost = 0
    for seen in page:
        one = _tick_one(engine, seen, clock)
        if one is None:
            lost += 1
        else:
            outcomes += one
    return page, outcomes, lost


def _tick_one(engine: Engine, seen: plan_store.Plan, clock: Clock) -> list[_Outcome] | None:
    """A page of one: the plan re-read and decided in its own transaction. None = the
    compare-and-set lost (another tick or an operator got there first)."""
    try:
        with engine.begin() as conn:
            now = clock.now(conn)
            plan = plan_store.get_plan(conn, seen.namespace_id, seen.kind)
            if plan is None:
                return []
            outcomes, writes = _decide(conn, [plan], now)
            plan_store.write_tick(conn, writes, now)
            return outcomes
    except plan_store.TickConflict:
        return None


def _decide(
    conn: Connection, plans: list[plan_store.Plan], now: datetime
) -> tuple[list[_Outcome], list[plan_store.TickWrite]]:
    """SPEC §4 for each plan as read in this transaction (two set-based reads for the page):
    what to report, and what to write by compare-and-set on exactly the values read."""
    states = plan_store.namespace_states_shared(conn, {p.namespace_id for p in plans})
    latest = plan_store.latest_policy_revisions(conn, {(p.namespace_id, p.kind) for p in plans})
    outcomes: list[_Outcome] = []
    writes: list[plan_store.TickWrite] = []
    for plan in plans:
        state = states.get(plan.namespace_id)
        latest_revision = latest.get((plan.namespace_id, plan.kind))
        action = plan_rules.tick_action(
            enabled=plan.enabled,
            next_run_at=plan.next_run_at,
            now=now,
            namespace_active=plan_rules.namespace_active(state),
            policy_revision=plan.policy_revision,
            latest_policy_revision=latest_revision,
            active_job_id=plan.active_job_id,
        )
        if action is TickAction.NOT_DUE:
            continue
        if action is TickAction.POLICY_UNCONFIRMED:
            # No job and next_run_at stays: the plan is due again as soon as the operator
            # confirms the latest revision (coalescing applies then).
            outcomes.append(_Outcome(action, plan, latest_policy_revision=latest_revision))
            continue
        next_run = plan_rules.next_after(plan.next_run_at, plan.interval_seconds, now)
        # COALESCED (a job is still active) and NAMESPACE_INACTIVE skip this run, phase kept.
        job_id = new_id() if action is TickAction.CREATE_JOB else None
        writes.append(plan_store.TickWrite(plan, next_run, job_id))
        outcomes.append(_Outcome(action, plan, next_run, job_id, namespace_state=state))
    return outcomes, writes


def _report(outcome: _Outcome, report: TickReport) -> None:
    plan = outcome.plan
    key = (plan.namespace_id.hex(), plan.kind)
    if outcome.action is TickAction.CREATE_JOB:
        assert outcome.job_id is not None
        report.jobs_created.append((*key, outcome.job_id.hex()))
        log_action(
            log,
            "archive.plan.job_created",
            namespace_id=plan.namespace_id,
            kind=plan.kind,
            job_id=outcome.job_id,
            storage_id=plan.storage_id,
            plan_revision=plan.revision,
            policy_revision=plan.policy_revision,
            next_run_at=outcome.next_run_at,
        )
    elif outcome.action is TickAction.POLICY_UNCONFIRMED:
        report.policy_unconfirmed.append(key)
        log_action(
            log,
            "archive.plan.policy_unconfirmed",
            logging.WARNING,
            namespace_id=plan.namespace_id,
            kind=plan.kind,
            plan_policy_revision=plan.policy_revision,
            latest_policy_revision=outcome.latest_policy_revision,
        )
    elif outcome.action is TickAction.COALESCED:
        report.coalesced.append(key)
        log_action(
            log,
            "archive.plan.coalesced",
            namespace_id=plan.namespace_id,
            kind=plan.kind,
            active_job_id=plan.active_job_id,
            next_run_at=outcome.next_run_at,
        )
    else:
        report.namespace_inactive.append(key)
        log_action(
            log,
            "archive.plan.namespace_inactive",
            logging.WARNING,
            namespace_id=plan.namespace_id,
            kind=plan.kind,
            namespace_state=outcome.namespace_state,
            next_run_at=outcome.next_run_at,
        )


def _sweep_and_publish(
    engine: Engine,
    storages: list[bytes],
    paused: list[Scope],
    closed: list[Scope],
    budget: int,
    publish: Publisher,
    clock: Clock,
    report: TickReport,
) -> None:
    """At most ``budget`` wake-ups in total; each storage gets an equal share first, and what a
    quiet storage leaves over goes to the following ones. Jobs of paused scopes and of scopes
    outside their run window (``closed``, judged at the tick's ``now``) get none: they would
    only wait, and the oldest of them would take every tick's wake-ups from the jobs that may
    run (a storage held as a whole is skipped). Jobs waiting for another reason get theirs as
    before, so that they run again within a tick of the reason ending; a window's jobs get
    theirs at the first tick inside it."""
    remaining = budget
    held = paused + closed
    for index, storage_id in enumerate(storages):
        if remaining <= 0:
            return
        where = control_store.not_paused(storage_id, held)
        if where is None:
            if control_store.not_paused(storage_id, paused) is None:
                report.paused_storages += 1
            continue
        share = min(remaining, math.ceil(remaining / (len(storages) - index)))
        with engine.connect() as conn:
            found = plan_store.sweep(conn, storage_id, clock.now(conn), share, where)
        for job in found:
            publish(storage_id, job.namespace_id, job.job_id, kind=job.kind)
            report.wakeups_published += 1
            remaining -= 1
            log_action(
                log,
                "archive.sweep.wakeup",
                storage_id=storage_id,
                namespace_id=job.namespace_id,
                job_id=job.job_id,
                kind=job.kind,
            )
