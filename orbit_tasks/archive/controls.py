"""Archive controls as pure rules (issue 16, docs/archive-controls.md): no I/O, time is ``now``.

One wait model: a job that may not run now waits for a :class:`WaitReason`. The engine asks
"may this job run now?" **before** it claims (``engine/gate.py``): a waiting job is never claimed
just to find out (a claim counts toward ``attempts`` and the stall guard). A running claim asks
the same at each batch boundary and, when the answer is a reason, confirms the file in hand
with a release to PENDING.

What lives here:

* :class:`Scope` -- where a control applies (any storage / one storage, any namespace / one,
  any kind / one) and the canonical key stored in ``orbit_archive_controls.scope``;
* :class:`Control` -- one row as a value; :func:`in_force` picks those that apply to a job;
* run windows: :func:`parse_window` (``HH:MM-HH:MM`` UTC, may wrap midnight, equal ends refused)
  and :func:`in_window`;
* the throttle's shared budget: :func:`take_budget` (GCRA arithmetic on one instant per scope,
  ``ready_at``, compared and set by the store with the database clock);
* the checks themselves: :data:`CHECKS`, a list of functions ``(JobView, Situation) -> reason``.
  The first reason found wins; ``None`` from every check means "run".

Where ``replica_lag`` plugs in: add a field to :class:`Situation` for what the engine read
(e.g. the heartbeat instant the replica has applied) and append one function to :data:`CHECKS`
(it returns ``WaitReason.REPLICA_LAG``); ``engine/gate.py`` fills the field where it builds the
situation (``gate.situation``) and again at the batch boundary (``gate.BatchGate``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from orbit_tasks import units
from orbit_tasks.errors import InvalidInput

MAX_WINDOWS = 16  # per control (the column holds 16 of "HH:MM-HH:MM," and more)
MAX_ROOTS_PER_SECOND = 10_000_000
MAX_REASON = 255
LOAD_CHECK_SECONDS = 1.0  # Threads_running is read at most once a second per claim chain


class WaitReason(enum.StrEnum):
    """Why a job waits instead of being claimed (or why a running claim stopped)."""

    PAUSED = "paused"
    THROTTLED = "throttled"
    DB_LOAD = "db_load"
    REPLICA_LAG = "replica_lag"
    WINDOW = "window"
    REPLICA_DIVERGED = "replica_diverged"


class ControlKind(enum.StrEnum):
    PAUSE = "pause"
    THROTTLE = "throttle"
    WINDOW = "window"


ANY = "*"


@dataclass(frozen=True)
class Scope:
    """Where a control applies; ``None`` = any. ``kind`` needs a namespace (CLI rule)."""

    storage_id: bytes | None = None
    namespace_id: bytes | None = None
    kind: str | None = None

    @property
    def key(self) -> str:
        """The canonical key: ``storage/namespace/kind`` in hex, ``*`` for any."""
        parts = [
            self.storage_id.hex() if self.storage_id else ANY,
            self.namespace_id.hex() if self.namespace_id else ANY,
            self.kind or ANY,
        ]
        return "/".join(parts)

    def covers(self, storage_id: bytes, namespace_id: bytes, kind: str) -> bool:
        return (
            (self.storage_id is None or self.storage_id == storage_id)
            and (self.namespace_id is None or self.namespace_id == namespace_id)
            and (self.kind is None or self.kind == kind)
        )

    @property
    def is_everything(self) -> bool:
        return self.storage_id is None and self.namespace_id is None and self.kind is None


def scope_keys(storage_id: bytes, namespace_id: bytes, kind: str) -> list[str]:
    """Every key of a scope that covers a job on (storage, namespace, kind)."""
    keys = []
    for s in (None, storage_id):
        for n in (None, namespace_id):
            for k in (None, kind) if n is not None else (None,):
                keys.append(Scope(s, n, k).key)
    return keys


@dataclass(frozen=True)
class Window:
    """A daily UTC window ``[start, end)`` in minutes of the day; ``end < start`` wraps."""

    start: int
    end: int

    def __str__(self) -> str:
        return (
            f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"
        )

    def contains(self, minute_of_day: float) -> bool:
        if self.start < self.end:
            return self.start <= minute_of_day < self.end
        return minute_of_day >= self.start or minute_of_day < self.end  # wraps midnight


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


_WINDOW = re.compile(r"(\d\d):(\d\d)-(\d\d):(\d\d)", re.ASCII)  # ASCII digits: units.py


def parse_window(text: str) -> Window:
    """``HH:MM-HH:MM`` (UTC, 00:00..23:59 each end). ``22:00-02:00`` wraps midnight; equal
    ends would be an empty window and are refused."""
    m = _WINDOW.fullmatch(text)  # no spaces, ASCII digits (units.py: the one rule)
    allowed = (
        "(allowed HH:MM-HH:MM of ASCII digits, UTC, 00:00..23:59 each end, different ends; may "
        "wrap midnight)"
    )
    if not m:
        raise InvalidInput(f"window {units.shown(text)} is invalid {allowed}")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
        raise InvalidInput(f"window {text!r} is invalid {allowed}")
    if (h1, m1) == (h2, m2):
        raise InvalidInput(f"window {text!r} is empty: its ends are equal {allowed}")
    return Window(h1 * 60 + m1, h2 * 60 + m2)


def parse_windows(texts: Sequence[str]) -> tuple[Window, ...]:
    if not texts:
        raise InvalidInput("no window given (allowed 1..16 windows HH:MM-HH:MM, UTC)")
    if len(texts) > MAX_WINDOWS:
        raise InvalidInput(f"{len(texts)} windows given (allowed 1..{MAX_WINDOWS})")
    return tuple(parse_window(t) for t in texts)


def format_windows(windows: Iterable[Window]) -> str:
    return ",".join(str(w) for w in windows)


def stored_windows(text: str) -> tuple[Window, ...]:
    """The column's ``HH:MM-HH:MM[,...]`` (written by :func:`format_windows`)."""
    return tuple(parse_window(t) for t in text.split(",") if t)


def in_window(windows: Sequence[Window], now: datetime) -> bool:
    """Inside any of ``windows`` at ``now`` (UTC)."""
    minute = now.hour * 60 + now.minute + (now.second + now.microsecond / 1e6) / 60
    return any(w.contains(minute) for w in windows)


def validate_rate(raw: str | int) -> int:
    """``--max-roots-per-second``: an integer 1..10,000,000 of ASCII digits (``１０`` and
    ``' 10'`` are refused, not read as 10: units.py, the one rule of digits)."""
    allowed = f"(allowed an integer 1..{MAX_ROOTS_PER_SECOND:,})"
    value = raw if isinstance(raw, int) else units.ascii_int(raw)
    if value is None:
        raise InvalidInput(
            f"{{max_roots_per_second}} {units.shown(str(raw))} is not an integer {allowed}",
            fields=("max_roots_per_second",),
        )
    if not 1 <= value <= MAX_ROOTS_PER_SECOND:
        raise InvalidInput(
            f"{{max_roots_per_second}} {value} is out of range {allowed}",
            fields=("max_roots_per_second",),
        )
    return value


def validate_reason(text: str) -> str:
    """The one reason rule (units.text_refusal, the sender's): 1..255 characters of printable
    text on one line."""
    refusal = units.text_refusal(text, "{reason}", MAX_REASON)
    if refusal:
        raise InvalidInput(refusal, fields=("reason",))
    return text


@dataclass(frozen=True)
class Control:
    """One row of ``orbit_archive_controls``."""

    kind: ControlKind
    scope: Scope
    actor: str
    since: datetime
    reason: str = ""
    max_roots_per_second: int | None = None
    windows: tuple[Window, ...] = ()


def in_force(
    controls: Iterable[Control], storage_id: bytes, namespace_id: bytes, kind: str
) -> list[Control]:
    """The controls whose scope covers a job on (storage, namespace, kind)."""
    return [c for c in controls if c.scope.covers(storage_id, namespace_id, kind)]


# --- the throttle's budget (GCRA on one instant per scope) --------------------------------------


def take_budget(
    ready_at: datetime | None, now: datetime, roots: int, rate: int
) -> tuple[datetime, float]:
    """Charge ``roots`` to a budget of ``rate`` roots/s shared by every worker of the scope.

    ``ready_at`` is the instant when everything taken so far is paid for (``None``: never
    taken). The charge moves it ``roots / rate`` seconds on from ``max(ready_at, now)`` (an idle
    budget saves nothing up: no burst). Returns the new ``ready_at`` and how long the caller
    must wait before it takes more: ``new ready_at - now``, minus the charge itself -- i.e. the
    caller may go on at once when the budget was idle, and otherwise waits its turn. Over any
    span the roots taken are at most ``rate * span`` plus one charge per taker."""
    start = now if ready_at is None or ready_at < now else ready_at
    cost = timedelta(microseconds=round(roots * 1_000_000 / rate))
    new = start + cost
    wait = max(0.0, (start - now).total_seconds())
    return new, wait


def budget_wait(ready_at: datetime | None, now: datetime) -> float:
    """Seconds until the budget is paid for (``0``: a charge may go on at once)."""
    if ready_at is None or ready_at <= now:
        return 0.0
    return (ready_at - now).total_seconds()


# --- the checks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    """What the checks know of the job."""

    storage_id: bytes
    namespace_id: bytes
    kind: str
    job_id: bytes = b""
    created_at: datetime | None = None


@dataclass(frozen=True)
class Situation:
    """What the engine read for the checks (once before a claim, again at batch boundaries)."""

    now: datetime
    controls: tuple[Control, ...] = ()  # those in force for the job (see :func:`in_force`)
    threads_running: int | None = None  # SHOW GLOBAL STATUS; None = not read / SQLite
    max_threads_running: int | None = None  # ORBIT_ARCHIVE_MAX_THREADS_RUNNING; None = no guard
    throttle_wait: float = 0.0  # seconds until every throttle's budget allows a charge
    extra: dict[str, object] = field(default_factory=dict)  # for checks added later


Check = Callable[[JobView, Situation], WaitReason | None]


def paused(job: JobView, s: Situation) -> WaitReason | None:
    return WaitReason.PAUSED if any(c.kind is ControlKind.PAUSE for c in s.controls) else None


def outside_window(job: JobView, s: Situation) -> WaitReason | None:
    """Inside a window of *every* window control in force (a storage's and a namespace's)."""
    for c in s.controls:
        if c.kind is ControlKind.WINDOW and not in_window(c.windows, s.now):
            return WaitReason.WINDOW
    return None


def db_loaded(job: JobView, s: Situation) -> WaitReason | None:
    if s.max_threads_running is None or s.threads_running is None:
        return None
    return WaitReason.DB_LOAD if s.threads_running > s.max_threads_running else None


def throttled(job: JobView, s: Situation) -> WaitReason | None:
    return WaitReason.THROTTLED if s.throttle_wait > 0 else None


#: The key of :attr:`Situation.extra` holding the heartbeat the replica has applied (present only
#: when the archive reads a replica, ``ORBIT_ARCHIVE_SOURCE_URL``; None = no beat there yet).
REPLICA_BEAT = "replica_beat_at"


def replica_behind(beat_at: datetime | None, created_at: datetime) -> bool:
    """A job may read the replica only once the replica shows a tick heartbeat written at or
    after the job's creation (the tick beats after its jobs committed; docs/operations.md "Read
    from a replica"). ``beat_at``: the heartbeat as the replica has applied it, None when it has
    none yet. ``Seconds_Behind_Master`` is not used: 0 or NULL while the SQL thread is stopped."""
    return beat_at is None or beat_at < created_at


def replica_lagging(job: JobView, s: Situation) -> WaitReason | None:
    if REPLICA_BEAT not in s.extra or job.created_at is None:
        return None
    beat = s.extra[REPLICA_BEAT]
    assert beat is None or isinstance(beat, datetime)
    return WaitReason.REPLICA_LAG if replica_behind(beat, job.created_at) else None


#: The key of :attr:`Situation.extra` holding the replica's errant GTIDs, ``d-s-n`` strings
#: (present only when the archive reads a replica; empty: the primary contains them all).
REPLICA_ERRANT = "replica_errant_gtids"


def replica_diverging(job: JobView, s: Situation) -> WaitReason | None:
    """A replica that executed transactions its primary has not is no copy of it (issue 24)."""
    return WaitReason.REPLICA_DIVERGED if s.extra.get(REPLICA_ERRANT) else None


#: In order: the first reason found is the one recorded.
CHECKS: list[Check] = [
    paused,
    outside_window,
    db_loaded,
    replica_diverging,
    replica_lagging,
    throttled,
]


def first_wait(job: JobView, s: Situation, checks: Sequence[Check] = CHECKS) -> WaitReason | None:
    for check in checks:
        reason = check(job, s)
        if reason is not None:
            return reason
    return None


def throttles(controls: Iterable[Control]) -> list[Control]:
    return [c for c in controls if c.kind is ControlKind.THROTTLE]


# --- statistics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WaitTotals:
    """Seconds waited by reason, and the open wait (if any) at ``now``."""

    seconds: dict[WaitReason, float]
    waiting: WaitReason | None
    waiting_since: datetime | None


def wait_totals(
    rows: Iterable[tuple[str, datetime | None, int]], now: datetime, *, open_counts: bool
) -> WaitTotals:
    """From the job's wait rows ``(reason, since, waited_us)``: closed microseconds plus, while
    the job is still waiting (``open_counts``: it is PENDING), ``now - since`` of the open one."""
    seconds = {r: 0.0 for r in WaitReason}
    waiting: WaitReason | None = None
    since_at: datetime | None = None
    for reason, since, waited_us in rows:
        r = WaitReason(reason)
        seconds[r] += waited_us / 1e6
        if since is not None and open_counts:
            seconds[r] += max(0.0, (now - since).total_seconds())
            waiting, since_at = r, since
    return WaitTotals(seconds, waiting, since_at)


def roots_per_second(roots: int, elapsed: float) -> float | None:
    return None if elapsed <= 0 else roots / elapsed
