"""Pure scheduling logic of archive plans (SPEC §4): the plan as a value, config validation, the
decisions of an operator change (``orbit plan set``: merge, checks, audit changes), coalescing,
due decisions.

No I/O here: every function receives ``now`` (the database clock, read by the store) and plain
values (what the store read: the current plan, the namespace's state, whether the storage is
registered, the latest policy revision), so the exact boundaries can be tested. Datetimes are
naive UTC.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import asdict, dataclass
from typing import Any

from orbit_tasks.errors import (
    Command,
    IllegalState,
    InvalidInput,
    NotFound,
    StaleRevision,
)
from orbit_tasks.platform.history import HISTORY_KINDS
from orbit_tasks.timestamps import format_ts
from orbit_tasks.units import format_duration, format_size

MIN_INTERVAL = 3600
MAX_INTERVAL = 2592000
MIN_BATCH = 1
MAX_BATCH = 100
MIN_MAX_BYTES = 1024**2
MAX_MAX_BYTES = 1024**3


NAMESPACE_ACTIVE = "ACTIVE"  # the namespace state in which plans run (platform registry)


def namespace_active(state: str | None) -> bool:
    """The namespace exists and is ACTIVE (``state`` None: it does not exist)."""
    return state == NAMESPACE_ACTIVE


@dataclass(frozen=True)
class Plan:
    """A plan row as read (``store.plans.plan_from_row``)."""

    namespace_id: bytes
    kind: str
    revision: int
    enabled: bool
    policy_revision: int
    storage_id: bytes
    interval_seconds: int
    batch_size: int
    max_bytes: int
    next_run_at: dt.datetime
    active_job_id: bytes | None
    created_at: dt.datetime
    updated_at: dt.datetime

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ids as hex, times as ISO strings."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, bytes):
                value = value.hex()
            elif isinstance(value, dt.datetime):
                value = stamp(value)
            out[key] = value
        return out


def stamp(value: dt.datetime) -> str:
    """A naive-UTC time as the operator reads it (``YYYY-MM-DDTHH:MM:SS.ffffffZ``)."""
    return format_ts(value)


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


# --- ``orbit plan set``: the decisions of an operator change -------------------------------------

#: The columns an operator change writes, in the order of the audit's ``changes``.
CONFIG_FIELDS = (
    "enabled",
    "policy_revision",
    "storage_id",
    "interval_seconds",
    "batch_size",
    "max_bytes",
)


@dataclass(frozen=True, kw_only=True)
class PlanChange:
    """What an operator asks of a plan: None keeps the current value (a new plan needs every
    value but ``enabled``, which defaults to False); ``expect_revision`` is the compare-and-set
    (0: "must not exist yet")."""

    storage_id: bytes | None = None
    interval_seconds: int | None = None
    batch_size: int | None = None
    max_bytes: int | None = None
    policy_revision: int | None = None
    enabled: bool | None = None
    expect_revision: int | None = None

    def given(self) -> dict[str, Any]:
        """The config values asked for (None: keep), in the order a new plan names the missing."""
        return {
            "storage_id": self.storage_id,
            "interval_seconds": self.interval_seconds,
            "batch_size": self.batch_size,
            "max_bytes": self.max_bytes,
            "policy_revision": self.policy_revision,
        }


@dataclass(frozen=True, kw_only=True)
class PlanValues:
    """The config columns of a plan after an operator change, each checked."""

    enabled: bool
    policy_revision: int
    storage_id: bytes
    interval_seconds: int
    batch_size: int
    max_bytes: int

    def columns(self) -> dict[str, Any]:
        """{column: value} in :data:`CONFIG_FIELDS` order."""
        return {k: getattr(self, k) for k in CONFIG_FIELDS}


def check_expect_revision(expect_revision: int | None) -> None:
    """The expected revision of a plan is absent, 0 (a new plan) or more."""
    if expect_revision is not None and expect_revision < 0:
        raise InvalidInput(
            f"{{expect_revision}} {expect_revision} is out of range (allowed 0 or more)",
            fields=("expect_revision",),
        )


def check_namespace(ns_id: bytes, state: str | None, *, active: bool = True) -> None:
    """The namespace exists (``state`` None: NotFound) and, with ``active``, is ACTIVE."""
    if state is None:
        raise NotFound(f"namespace {ns_id.hex()} does not exist")
    if active and not namespace_active(state):
        raise IllegalState(f"namespace {ns_id.hex()} is {state}, not {NAMESPACE_ACTIVE}")


def merge_change(kind: str, current: Plan | None, change: PlanChange) -> PlanValues:
    """The plan's config after ``change`` (None keeps the current value), every value in its
    range: a new plan needs every value and an expected revision of 0 or none; an existing one
    must be at the expected revision. Raises InvalidInput / StaleRevision."""
    given = change.given()
    if current is None:
        missing = tuple(k for k, v in given.items() if v is None)
        if missing:
            needs = ", ".join("{" + k + "}" for k in missing)
            raise InvalidInput(f"a new plan needs {needs}", fields=missing)
        if change.expect_revision not in (None, 0):
            raise StaleRevision(
                f"plan {kind!r} does not exist (expected revision {change.expect_revision}; use "
                "0 or omit {expect_revision} to create it)",
                fields=("expect_revision",),
            )
        merged, enabled = given, bool(change.enabled)
    else:
        if change.expect_revision is not None and change.expect_revision != current.revision:
            raise StaleRevision(
                f"plan {kind!r} is at revision {current.revision}, not {change.expect_revision}"
            )
        merged = {k: getattr(current, k) if v is None else v for k, v in given.items()}
        enabled = current.enabled if change.enabled is None else change.enabled
    config = validate_config(
        PlanConfig(
            kind=kind,
            interval_seconds=merged["interval_seconds"],
            batch_size=merged["batch_size"],
            max_bytes=merged["max_bytes"],
            policy_revision=merged["policy_revision"],
        )
    )
    return PlanValues(
        enabled=enabled,
        policy_revision=config.policy_revision,
        storage_id=merged["storage_id"],
        interval_seconds=config.interval_seconds,
        batch_size=config.batch_size,
        max_bytes=config.max_bytes,
    )


def check_references(
    kind: str,
    values: PlanValues,
    *,
    storage_registered: bool,
    latest_policy_revision: int | None,
    storage_retired: bool = False,
    storage_before: bytes | None = None,
) -> None:
    """What the plan's values name exists: its storage is registered, the namespace has a
    retention policy for ``kind``, and the confirmed revision is one of its revisions. A retired
    storage (issue 27) keeps the disabled plans it has, but no plan is enabled on it or moved to
    it (``storage_before``: the plan's storage before the change, None for a new plan). Raises
    NotFound / InvalidInput / IllegalState."""
    if not storage_registered:
        raise NotFound(
            f"storage {values.storage_id.hex()} is not registered (see {{command}})",
            command=Command.STORAGE_LIST,
        )
    if storage_retired and (values.enabled or values.storage_id != storage_before):
        raise IllegalState(
            f"storage {values.storage_id.hex()} is retired: no plan is enabled on it or moved "
            "to it (choose another {storage_id})",
            fields=("storage_id",),
        )
    if latest_policy_revision is None:
        raise NotFound(
            f"no retention policy for kind {kind!r} in this namespace (create one with "
            "{command})",
            command=Command.POLICY_SET,
            command_args={"kind": kind},
        )
    if values.policy_revision > latest_policy_revision:
        raise InvalidInput(
            f"{{policy_revision}} {values.policy_revision} does not exist for kind {kind!r} "
            f"(allowed 1..{latest_policy_revision})",
            fields=("policy_revision",),
        )


def plan_changes(current: Plan | None, values: PlanValues) -> dict[str, list[Any]]:
    """The audit's ``changes`` of an operator change: ``{column: [old, new]}`` of each value that
    differs (every value of a new plan, from None), ids as hex. Empty: nothing to write."""
    new = values.columns()
    if current is None:
        return {k: [None, _show(v)] for k, v in new.items()}
    return {
        k: [_show(getattr(current, k)), _show(v)]
        for k, v in new.items()
        if getattr(current, k) != v
    }


def _show(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else value


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


@dataclass(frozen=True, kw_only=True)
class RunRefusal:
    """Why a plan may not run now: the reason (a ``{command}`` placeholder where it points the
    operator to ``command``), as an :class:`~orbit_tasks.errors.IllegalState` carries it."""

    reason: str
    command: Command | None = None

    def __str__(self) -> str:
        return self.reason.replace("{command}", self.command or "")


def run_refusal(
    *,
    enabled: bool,
    namespace_state: str,
    policy_revision: int,
    latest_policy_revision: int | None,
    active_job_id: bytes | None,
    active_job_state: str | None = None,
) -> RunRefusal | None:
    """Why ``orbit plan run`` must not make the plan due now, or None when it may: the namespace
    is not ACTIVE, the plan is disabled, its policy is unconfirmed, or it has an active job (the
    tick would coalesce the run into it, so the operator's "now" would not happen)."""
    if not namespace_active(namespace_state):
        return RunRefusal(reason=f"namespace is {namespace_state}, not {NAMESPACE_ACTIVE}")
    if not enabled:
        return RunRefusal(
            reason="plan is disabled (enable it with {command})", command=Command.PLAN_ENABLE
        )
    if latest_policy_revision is None or policy_revision != latest_policy_revision:
        return RunRefusal(
            reason=(
                f"policy unconfirmed: plan confirms revision {policy_revision}, latest is "
                f"{latest_policy_revision} (confirm it with {{command}})"
            ),
            command=Command.PLAN_CONFIRM_POLICY,
        )
    if active_job_id is not None:
        state = f" ({active_job_state})" if active_job_state else ""
        return RunRefusal(
            reason=(
                f"plan has an active job {active_job_id.hex()}{state}; a new job is created "
                "only after it ends (see {command})"
            ),
            command=Command.JOB_SHOW,
        )
    return None


def refuse_run(kind: str, refusal: RunRefusal) -> IllegalState:
    """The error of ``orbit plan run`` refused for ``refusal``."""
    return IllegalState(f"plan {kind!r} cannot run now: {refusal.reason}", command=refusal.command)


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
