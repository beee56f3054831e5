"""What a job created now would archive (``orbit plan preview``, issue 16 item 6); writes nothing.

The prospective job is the row a tick would insert for the plan at the database clock's ``now``
(:func:`plan_store.new_job_row`); its range comes from the same :func:`store.jobs.range_at` the
runner derives every job's range with (SPEC §5), so the preview and the job agree by
construction. Roots and children in the range are exact counts on the source (the replica when
``ORBIT_ARCHIVE_SOURCE_URL`` is set, like the batches; a job's manifest counts on the primary).
Bytes and files are estimated from a sample (docs/cli.md "orbit plan preview";
:mod:`~orbit_tasks.archive.engine.budget`, the same measure a job cuts its range with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine

from orbit_tasks.archive import controls as control_rules
from orbit_tasks.archive import plans as plan_rules
from orbit_tasks.archive.controls import Control, ControlKind, WaitReason
from orbit_tasks.archive.engine import gate
from orbit_tasks.archive.engine.budget import Estimate, estimate
from orbit_tasks.archive.jobs import Job, JobFailure
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.store import source
from orbit_tasks.db.engine import Clock
from orbit_tasks.settings import Settings
from orbit_tasks.timestamps import format_optional

BACKLOG_FIELDS = (
    "backlog_roots", "backlog_bytes", "backlog_jobs", "rate_roots_per_second",
    "backlog_eta_seconds",
)  # fmt: skip
#: Sorts after every real job id: a job created now follows every job created before it.
PREVIEW_JOB_ID = b"\xff" * 16
_NEW_JOB = dict(
    revision=1, attempts=0, batches=0, roots=0, bytes=0, last_sha256="", error_code="",
    lease_id=None, lease_until=None,
)  # fmt: skip


@dataclass(frozen=True)
class ControlsNow:
    """The archive controls over the job's scope now, as the gate before a claim reads them
    (``engine/gate.py``): those in force and the first reason a claim now would wait for."""

    controls: tuple[Control, ...] = ()
    wait_now: WaitReason | None = None
    now: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        throttles = control_rules.throttles(self.controls)
        windows = [c for c in self.controls if c.kind is ControlKind.WINDOW]
        return {
            "paused": any(c.kind is ControlKind.PAUSE for c in self.controls),
            "throttled": bool(throttles),
            "max_roots_per_second": min(
                (c.max_roots_per_second or 0 for c in throttles), default=None
            ),
            "outside_window": any(
                self.now is not None and not control_rules.in_window(c.windows, self.now)
                for c in windows
            ),
            "wait_now": None if self.wait_now is None else self.wait_now.value,
            "controls": [
                {
                    "control": c.kind.value,
                    "scope": c.scope.key,
                    "max_roots_per_second": c.max_roots_per_second,
                    "windows": [str(w) for w in c.windows],
                    "reason": c.reason,
                    "actor": c.actor,
                    "since": _ts(c.since),
                }
                for c in self.controls
            ],
        }


def controls_now(primary: Engine, job: Job, settings: Settings, clock: Clock) -> ControlsNow:
    """The gate of a claim of ``job`` now, on a connection of its own (read only): the controls
    in force, and the first wait reason of the checks before a claim (paused, window, db_load,
    throttled). ``replica_lag`` is left out: a job created now always waits for the next beat."""
    with primary.connect() as conn:
        g = gate.open_gate(conn, gate.view(job), settings, clock, waits=False)
        reason, _wait = g.before_claim(conn)
    return ControlsNow(g.controls, reason, g.now())


@dataclass(frozen=True)
class Preview:
    kind: str
    now: datetime
    plan: plan_store.Plan
    latest_policy_revision: int | None
    namespace_state: str | None
    tick_action: plan_rules.TickAction
    active_job_state: str | None
    range: ArchiveRange | None  # None: the policy revision row is gone (POLICY_MISSING)
    roots: int = 0
    children: dict[str, int] = field(default_factory=dict)
    estimate: Estimate | None = None
    controls: ControlsNow = field(default_factory=ControlsNow)
    replica_beat_at: datetime | None = None  # the tick beat the replica shows (with a replica)
    rate: float | None = None  # roots/s of the plan's recent SUCCEEDED jobs (None: none yet)

    @property
    def policy_confirmed(self) -> bool:
        return self.plan.policy_revision == self.latest_policy_revision

    @property
    def due(self) -> bool:
        return plan_rules.is_due(self.plan.enabled, self.plan.next_run_at, self.now)

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        est = self.estimate
        return {
            "namespace_id": plan.namespace_id.hex(),
            "kind": self.kind,
            "now": _ts(self.now),
            "range_from": None if self.range is None else _ts(self.range.from_),
            "range_until": None if self.range is None else _ts(self.range.until),
            "policy_missing": self.range is None,
            "roots": self.roots,
            "children": dict(self.children),
            "estimated_bytes": None if est is None else est.bytes,
            "estimated_files": None if est is None else est.files,
            "sample_roots": 0 if est is None else est.sample_roots,
            "bytes_per_root": None if est is None else round(est.bytes_per_root, 1),
            "roots_per_file": None if est is None else round(est.roots_per_file, 1),
            "max_bytes": plan.max_bytes,
            "over_budget": est is not None and est.bytes > plan.max_bytes,
            "batch_size": plan.batch_size,
            "storage_id": plan.storage_id.hex(),
            "plan_revision": plan.revision,
            "enabled": plan.enabled,
            "policy_revision": plan.policy_revision,
            "latest_policy_revision": self.latest_policy_revision,
            "policy_confirmed": self.policy_confirmed,
            "next_run_at": _ts(plan.next_run_at),
            "due": self.due,
            "namespace_state": self.namespace_state,
            "active_job_id": None if plan.active_job_id is None else plan.active_job_id.hex(),
            "active_job_state": self.active_job_state,
            "tick_action": self.tick_action.value,
            **self.controls.to_dict(),
            "replica_beat_at": _ts(self.replica_beat_at),
            **self.backlog(),
        }

    def backlog(self) -> dict[str, Any]:
        """The catch-up (issue 25 item 4): the roots settled and not yet archived (the range of
        a job created now starts at the greatest archived end), their estimated bytes, the
        fewest jobs at the plan's budget, and the time at the plan's measured rate."""
        if self.range is None:  # POLICY_MISSING: no range, so no backlog to tell
            return dict.fromkeys(BACKLOG_FIELDS)
        est = self.estimate
        size = None if est is None else est.bytes
        return {
            "backlog_roots": self.roots,
            "backlog_bytes": size,
            "backlog_jobs": plan_rules.jobs_for(size, self.roots, self.plan.max_bytes),
            "rate_roots_per_second": None if self.rate is None else round(self.rate, 1),
            "backlog_eta_seconds": _round(plan_rules.eta_seconds(self.roots, self.rate)),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _ts(value: datetime | None) -> str | None:
    return format_optional(value)


def preview(
    primary: Connection,
    src: Connection,
    plan: plan_store.Plan,
    clock: Clock,
    *,
    controls: ControlsNow | None = None,
    replica: bool = False,
    children: bool = True,
) -> Preview:
    """The preview of ``plan``'s next job: plans, policies and jobs read on ``primary``, the
    source on ``src`` (the same connection without a replica; ``replica``: it is one, and its
    heartbeat is shown). ``controls``: :func:`controls_now` of the prospective job
    (:func:`prospective_job`). ``children``: count the range's child rows too (``plan show``,
    which needs only the backlog, leaves them out). Reads only."""
    now = clock.now(primary)
    ns_id, kind = plan.namespace_id, plan.kind
    latest = plan_store.latest_policy_revision(primary, ns_id, kind)
    state = plan_store.namespace_states_shared(primary, [ns_id]).get(ns_id)
    action = plan_rules.tick_action(
        enabled=plan.enabled,
        next_run_at=plan.next_run_at,
        now=now,
        namespace_active=plan_rules.namespace_active(state),
        policy_revision=plan.policy_revision,
        latest_policy_revision=latest,
        active_job_id=plan.active_job_id,
    )
    active_state = None
    if plan.active_job_id is not None:
        active = job_store.get_job(primary, ns_id, plan.active_job_id)
        active_state = None if active is None else active.state.value
    job = prospective_job(plan, now)
    rate = plan_rules.rate_of(*plan_store.recent_successes(primary, ns_id, kind))
    ctl = controls or ControlsNow()
    beat = source.replica_beat(src) if replica else None
    base = Preview(
        kind, now, plan, latest, state, action, active_state, None,
        controls=ctl, replica_beat_at=beat, rate=rate,
    )  # fmt: skip
    try:
        rng = job_store.range_at(primary, ns_id, kind, plan.policy_revision, now, PREVIEW_JOB_ID)
    except JobFailure:  # POLICY_MISSING: a job created now would fail at its first claim
        return base
    roots = source.count_roots(src, kind, ns_id, rng)
    kids = source.count_children(src, kind, ns_id, rng) if children else {}
    try:
        est: Estimate | None = estimate(src, job, rng, roots)
    except JobFailure:  # SOURCE_INVALID / ROOT_TOO_LARGE: the job would fail; no estimate
        est = None
    return Preview(
        kind, now, plan, latest, state, action, active_state, rng, roots, kids, est, ctl, beat,
        rate,
    )  # fmt: skip


def prospective_job(plan: plan_store.Plan, now: datetime) -> Job:
    """The PENDING job a tick would create for ``plan`` at ``now`` (never written)."""
    return Job.from_row({**plan_store.new_job_row(plan, PREVIEW_JOB_ID, now), **_NEW_JOB})
