"""Pure scheduling logic of archive plans (SPEC §4): config validation, coalescing, due decisions.

No I/O here: every function receives ``now`` (the database clock, read by the store) and plain
values, so the exact boundaries can be tested. Datetimes are naive UTC.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

from orbit_tasks.errors import InvalidInput
from orbit_tasks.platform.history import HISTORY_KINDS
from orbit_tasks.units import format_duration, format_size

MIN_INTERVAL = 3600
MAX_INTERVAL = 2592000
MIN_BATCH = 1
MAX_BATCH = 100
MIN_MAX_BYTES = 1024**2
MAX_MAX_BYTES = 1024**3


@dataclass(frozen=True)
class PlanConfig:
    """The operator-set values of a plan (what ``orbit plan set`` writes)."""

    kind: str
    interval_seconds: int
    batch_size: int
    max_bytes: int
    policy_revision: int


def validate_kind(kind: str) -> str:
    if kind not in HISTORY_KINDS:
        allowed = ", ".join(HISTORY_KINDS)
        raise InvalidInput(f"kind {kind!r} is not a history kind (allowed: {allowed})")
    return kind


def _int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{{{field}}} {value!r} is not an integer", fields=(field,))
    return value


def validate_interval(seconds: int) -> int:
    seconds = _int(seconds, "interval_seconds")
    if not MIN_INTERVAL <= seconds <= MAX_INTERVAL:
        raise InvalidInput(
            f"{{interval_seconds}} {seconds}s is out of range (allowed {MIN_INTERVAL}.."
            f"{MAX_INTERVAL} seconds, {format_duration(MIN_INTERVAL)}.."
            f"{format_duration(MAX_INTERVAL)})",
            fields=("interval_seconds",),
        )
    return seconds


def validate_batch_size(n: int) -> int:
    n = _int(n, "batch_size")
    if not MIN_BATCH <= n <= MAX_BATCH:
        raise InvalidInput(
            f"{{batch_size}} {n} is out of range (allowed {MIN_BATCH}..{MAX_BATCH})",
            fields=("batch_size",),
        )
    return n


def validate_max_bytes(n: int) -> int:
    n = _int(n, "max_bytes")
    if not MIN_MAX_BYTES <= n <= MAX_MAX_BYTES:
        raise InvalidInput(
            f"{{max_bytes}} {n} is out of range (allowed {MIN_MAX_BYTES}..{MAX_MAX_BYTES} bytes, "
            f"{format_size(MIN_MAX_BYTES)}..{format_size(MAX_MAX_BYTES)})",
            fields=("max_bytes",),
        )
    return n


def validate_policy_revision(n: int) -> int:
    n = _int(n, "policy_revision")
    if n < 1:
        raise InvalidInput(
            f"{{policy_revision}} {n} is out of range (allowed 1 or more)",
            fields=("policy_revision",),
        )
    return n


def validate_config(config: PlanConfig) -> PlanConfig:
    """Check every value of ``config``; the first bad one raises InvalidInput naming its range."""
    validate_kind(config.kind)
    validate_interval(config.interval_seconds)
    validate_batch_size(config.batch_size)
    validate_max_bytes(config.max_bytes)
    validate_policy_revision(config.policy_revision)
    return config


def next_after(next_run_at: dt.datetime, interval_seconds: int, now: dt.datetime) -> dt.datetime:
    """The next run after a tick at ``now`` (missed runs coalesce into one, phase kept).

    ``next_run_at + k * interval`` for the smallest k >= 0 with a result strictly later than
    ``now``; a ``next_run_at`` already in the future is returned unchanged. Integer arithmetic on
    microseconds, so the phase never drifts.
    """
    if interval_seconds <= 0:
        raise InvalidInput(f"interval {interval_seconds} must be positive")
    if next_run_at > now:
        return next_run_at
    step = dt.timedelta(seconds=interval_seconds)
    k = (now - next_run_at) // step + 1
    return next_run_at + k * step


def is_due(enabled: bool, next_run_at: dt.datetime, now: dt.datetime) -> bool:
    """A plan is due when it is enabled and ``next_run_at <= now`` (equality is due)."""
    return bool(enabled) and next_run_at <= now


def next_run_on_change(
    was_enabled: bool | None,
    enabled: bool,
    current_next_run_at: dt.datetime | None,
    now: dt.datetime,
) -> dt.datetime:
    """``next_run_at`` after an operator change.

    ``was_enabled`` is None for a new plan. Every transition into enabled (a new enabled plan, or
    disabled -> enabled) makes the plan due now ("first enable is due immediately"). Otherwise the
    scheduled time is kept (an interval change applies from the next run on). A new disabled plan
    gets ``now`` as a placeholder (the column is NOT NULL); enabling it later resets it to now.
    """
    if current_next_run_at is None or was_enabled is None:
        return now
    if enabled and not was_enabled:
        return now
    return current_next_run_at


class TickAction(enum.Enum):
    """What one tick does with one plan row."""

    NOT_DUE = "not_due"
    NAMESPACE_INACTIVE = "namespace_inactive"  # skipped; next_run_at advanced (coalesced)
    POLICY_UNCONFIRMED = "policy_unconfirmed"  # no job; next_run_at NOT advanced
    COALESCED = "coalesced"  # a job is still active; next_run_at advanced
    CREATE_JOB = "create_job"  # new PENDING job; next_run_at advanced


def tick_action(
    *,
    enabled: bool,
    next_run_at: dt.datetime,
    now: dt.datetime,
    namespace_active: bool,
    policy_revision: int,
    latest_policy_revision: int | None,
    active_job_id: bytes | None,
) -> TickAction:
    """The decision for one plan, in this order: not due, namespace inactive, policy
    unconfirmed, job still active (coalesce), else create a job."""
    if not is_due(enabled, next_run_at, now):
        return TickAction.NOT_DUE
    if not namespace_active:
        return TickAction.NAMESPACE_INACTIVE
    if latest_policy_revision is None or policy_revision != latest_policy_revision:
        return TickAction.POLICY_UNCONFIRMED
    if active_job_id is not None:
        return TickAction.COALESCED
    return TickAction.CREATE_JOB


# --- ``orbit plan run``: archive now, phase kept -------------------------------------------------


def run_refusal(
    *,
    enabled: bool,
    namespace_state: str,
    policy_revision: int,
    latest_policy_revision: int | None,
    active_job_id: bytes | None,
    active_job_state: str | None = None,
) -> str | None:
    """Why ``orbit plan run`` must not make the plan due now, or None when it may: the namespace
    is not ACTIVE, the plan is disabled, its policy is unconfirmed, or it has an active job (the
    tick would coalesce the run into it, so the operator's "now" would not happen)."""
    if namespace_state != "ACTIVE":
        return f"namespace is {namespace_state}, not ACTIVE"
    if not enabled:
        return "plan is disabled (enable it with orbit plan set NS KIND --enable)"
    if latest_policy_revision is None or policy_revision != latest_policy_revision:
        return (
            f"policy unconfirmed: plan confirms revision {policy_revision}, latest is "
            f"{latest_policy_revision} (confirm it with orbit plan set --policy-revision)"
        )
    if active_job_id is not None:
        state = f" ({active_job_state})" if active_job_state else ""
        return (
            f"plan has an active job {active_job_id.hex()}{state}; a new job is created only "
            "after it ends (see orbit job show)"
        )
    return None


def run_now_at(next_run_at: dt.datetime, interval_seconds: int, now: dt.datetime) -> dt.datetime:
    """The ``next_run_at`` that makes a plan due at ``now`` and keeps its phase
    (docs/decisions.md "plan run keeps the phase"): ``next_run_at - k * interval`` for the
    smallest k >= 0 with a result ``<= now``. The tick that creates the run's job advances it by
    whole intervals (:func:`next_after`) back to the first slot of the phase after ``now``, which
    is the run the plan had scheduled: a run now does not move the schedule."""
    if interval_seconds <= 0:
        raise InvalidInput(f"interval {interval_seconds} must be positive")
    if next_run_at <= now:
        return next_run_at
    step = dt.timedelta(seconds=interval_seconds)
    k = -((now - next_run_at) // step)  # ceil((next_run_at - now) / step), microsecond exact
    return next_run_at - k * step


# --- the catch-up, seen from the operator's side (issue 25 item 4) ------------------------------

RATE_JOBS = 5  # the plan's most recent SUCCEEDED jobs that measure its rate


def rate_of(roots: int, seconds: float) -> float | None:
    """Roots per second of the plan's recent jobs (their roots over the time from each job's
    creation to its success), or None when there is nothing measured."""
    if roots <= 0 or seconds <= 0:
        return None
    return roots / seconds


def jobs_for(estimated_bytes: int | None, roots: int, max_bytes: int) -> int | None:
    """The fewest jobs that archive ``estimated_bytes`` at the budget ``max_bytes`` (None: no
    estimate). Budget-sized ranges keep a safety margin below the budget, so the catch-up may
    take a job or two more."""
    if roots == 0:
        return 0
    if estimated_bytes is None:
        return None
    return max(1, -(-estimated_bytes // max_bytes))


def eta_seconds(roots: int, rate: float | None) -> float | None:
    """Seconds to archive ``roots`` at ``rate`` roots/s (None: unknown, no rate measured)."""
    if roots == 0:
        return 0.0
    if rate is None:
        return None
    return roots / rate
