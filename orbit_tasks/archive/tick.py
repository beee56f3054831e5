"""One archive tick (SPEC §7): due plans -> jobs, then the sweep -> wake-ups.

Beat's ``orbit.archive.tick`` task and ``orbit archive tick`` both call :func:`run_tick`.
Every decision uses the database clock. Each plan is handled in its own short transaction with a
compare-and-set on the plan row, so two ticks at once (a duplicate beat) create no extra job: the
loser's update matches no row and it skips the plan. Wake-ups are published after the
transactions commit; losing them only delays work until the next tick's sweep.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from orbit_tasks.archive import plan_store, schedule
from orbit_tasks.archive.wakeups import Publisher, publish_wakeup
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.faults import driver_code, is_transient_db
from orbit_tasks.errors import TransientError
from orbit_tasks.logs import log_action
from orbit_tasks.platform.store import list_storages
from orbit_tasks.settings import Settings

log = logging.getLogger(__name__)

DUE_PAGE = 200


@dataclass
class TickReport:
    storages: int = 0
    jobs_created: list[tuple[str, str, str]] = field(default_factory=list)  # (ns, kind, job)
    policy_unconfirmed: list[tuple[str, str]] = field(default_factory=list)  # (ns, kind)
    coalesced: list[tuple[str, str]] = field(default_factory=list)
    namespace_inactive: list[tuple[str, str]] = field(default_factory=list)
    lost: int = 0  # compare-and-set lost: another tick or an operator changed the plan first
    wakeups_published: int = 0
    now: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["now"] = None if self.now is None else self.now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        out["jobs_created"] = [
            {"namespace_id": ns, "kind": kind, "job_id": job} for ns, kind, job in self.jobs_created
        ]
        for key in ("policy_unconfirmed", "coalesced", "namespace_inactive"):
            out[key] = [{"namespace_id": ns, "kind": kind} for ns, kind in getattr(self, key)]
        return out


def run_tick(engine: Engine, settings: Settings, publish: Publisher = publish_wakeup) -> TickReport:
    """One tick. Transient database or broker faults are logged and raised as TransientError
    (nothing is half-done: committed jobs are found again by the next tick's sweep)."""
    report = TickReport()
    stage = "plans"
    try:
        with engine.connect() as conn:
            now = db_now(conn)
            storages = [bytes.fromhex(s["storage_id"]) for s in list_storages(conn)]
        report.now = now
        report.storages = len(storages)
        for storage_id in storages:
            _create_jobs(engine, storage_id, now, report)
        stage = "sweep"
        _sweep_and_publish(engine, storages, settings.archive_wakeups_per_tick, publish, report)
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
            raise TransientError("broker unavailable; the next tick publishes again") from None
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
        from kombu.exceptions import OperationalError as KombuOperationalError
    except ImportError:  # pragma: no cover - kombu ships with celery
        return False
    return isinstance(exc, KombuOperationalError | OSError)  # OSError: unreachable, no folder


def _create_jobs(engine: Engine, storage_id: bytes, now: datetime, report: TickReport) -> None:
    after: plan_store.DueCursor | None = None
    while True:
        with engine.connect() as conn:
            page = plan_store.due_plans(conn, storage_id, now, DUE_PAGE, after)
        for plan in page:
            _handle_plan(engine, plan, report)
        if len(page) < DUE_PAGE:
            return
        last = page[-1]
        after = (last.next_run_at, last.namespace_id, last.kind)


def _handle_plan(engine: Engine, seen: plan_store.Plan, report: TickReport) -> None:
    ns_hex, kind = seen.namespace_id.hex(), seen.kind
    with engine.begin() as conn:
        now = db_now(conn)
        # Decide on the row as it is now (the scan may be a moment old); the compare-and-set
        # below is on exactly these values.
        plan = plan_store.get_plan(conn, seen.namespace_id, kind)
        if plan is None:
            return
        state = plan_store.namespace_state_shared(conn, plan.namespace_id)
        latest = plan_store.latest_policy_revision(conn, plan.namespace_id, kind)
        action = schedule.tick_action(
            enabled=plan.enabled,
            next_run_at=plan.next_run_at,
            now=now,
            namespace_active=state == "ACTIVE",
            policy_revision=plan.policy_revision,
            latest_policy_revision=latest,
            active_job_id=plan.active_job_id,
        )
        if action is schedule.TickAction.NOT_DUE:
            return
        if action is schedule.TickAction.POLICY_UNCONFIRMED:
            # No job and next_run_at stays: the plan is due again as soon as the operator
            # confirms the latest revision (coalescing applies then).
            report.policy_unconfirmed.append((ns_hex, kind))
            log_action(
                log,
                "archive.plan.policy_unconfirmed",
                logging.WARNING,
                namespace_id=plan.namespace_id,
                kind=kind,
                plan_policy_revision=plan.policy_revision,
                latest_policy_revision=latest,
            )
            return
        next_run = schedule.next_after(plan.next_run_at, plan.interval_seconds, now)
        if action is schedule.TickAction.CREATE_JOB:
            job_id = plan_store.create_job(conn, plan, next_run, now)
            if job_id is None:
                report.lost += 1
                return
            report.jobs_created.append((ns_hex, kind, job_id.hex()))
            log_action(
                log,
                "archive.plan.job_created",
                namespace_id=plan.namespace_id,
                kind=kind,
                job_id=job_id,
                storage_id=plan.storage_id,
                plan_revision=plan.revision,
                policy_revision=plan.policy_revision,
                next_run_at=next_run,
            )
            return
        # COALESCED (a job is still active) or NAMESPACE_INACTIVE: skip this run, keep the phase.
        if not plan_store.advance_plan(conn, plan, next_run):
            report.lost += 1
            return
        if action is schedule.TickAction.COALESCED:
            report.coalesced.append((ns_hex, kind))
            log_action(
                log,
                "archive.plan.coalesced",
                namespace_id=plan.namespace_id,
                kind=kind,
                active_job_id=plan.active_job_id,
                next_run_at=next_run,
            )
        else:
            report.namespace_inactive.append((ns_hex, kind))
            log_action(
                log,
                "archive.plan.namespace_inactive",
                logging.WARNING,
                namespace_id=plan.namespace_id,
                kind=kind,
                namespace_state=state,
                next_run_at=next_run,
            )


def _sweep_and_publish(
    engine: Engine,
    storages: list[bytes],
    budget: int,
    publish: Publisher,
    report: TickReport,
) -> None:
    """At most ``budget`` wake-ups in total; each storage gets an equal share first, and what a
    quiet storage leaves over goes to the following ones."""
    remaining = budget
    for index, storage_id in enumerate(storages):
        if remaining <= 0:
            return
        share = min(remaining, math.ceil(remaining / (len(storages) - index)))
        with engine.connect() as conn:
            now = db_now(conn)
            found = plan_store.sweep(conn, storage_id, now, share)
        for ns_id, job_id in found:
            publish(storage_id, ns_id, job_id)
            report.wakeups_published += 1
            remaining -= 1
            log_action(
                log,
                "archive.sweep.wakeup",
                storage_id=storage_id,
                namespace_id=ns_id,
                job_id=job_id,
            )
