"""The scheduled scrub as pure rules (issue 28 item 3): its outcomes, when a SUCCEEDED job is
due for re-verification, and the token bucket that bounds the read rate of one storage.

No I/O: the store reads the rows, the engine (``engine/scrub.py``) reads the files and sleeps;
every function here takes ``now`` (the database clock) or a monotonic reading as an argument.

A job counts as verified when it SUCCEEDED (the runner's final step re-verified its whole chain
from the storage) until its first scrub; then at its latest scrub that verified. It is due once
that time is ``ORBIT_ARCHIVE_SCRUB_DAYS`` old. A scrub that did not verify leaves the time of
the last verification as it was: the oldest-verification gauge keeps growing until the job
verifies again (repaired, then scrubbed).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

#: The longest single sleep of the bucket: the scrub looks at its lease and the controls at
#: least this often while it waits for its turn.
MAX_SLEEP_SECONDS = 1.0
#: The bucket holds at most this much of a second's bytes: no burst beyond it after a pause.
BURST_SECONDS = 0.1


class ScrubOutcome(StrEnum):
    """What the latest scrub of a job found (``orbit_archive_scrubs.outcome``)."""

    OK = "ok"  # the chain verified from the storage
    BAD = "bad"  # it did not: ``first_bad_file`` and ``reason`` say where and why
    REPAIRED = "repaired"  # it did not, the self-repair rebuilt the files, and it verified then


class ScrubStop(StrEnum):
    """Why a scrub pass of a storage ended (logs, ``orbit archive scrub``, the task's result)."""

    DONE = "done"  # nothing left due
    SLICE = "slice"  # its time slice ended: released, continued by a wake-up
    PAUSED = "paused"  # a pause covers the storage, namespace or kind of the next job
    WINDOW = "window"  # outside a run window of that scope
    DB_LOAD = "db_load"  # the load guard
    BUSY = "busy"  # another scrub holds the storage's lease
    OFF = "off"  # ORBIT_ARCHIVE_SCRUB_DAYS=0
    LEASE_LOST = "lease_lost"  # the lease expired under it and another scrub took the storage
    IO_ERROR = "io_error"  # the storage did not answer (not a verdict on the files: retried)


def last_verified(succeeded_at: datetime, verified_at: datetime | None, scrubbed: bool) -> datetime:
    """When the job's chain last verified from its storage: its latest verifying scrub, or its
    success (the runner's final re-verification) when no scrub ever verified it. A job whose
    every scrub failed keeps its success time: it is the oldest verification there is."""
    if scrubbed and verified_at is not None:
        return verified_at
    return succeeded_at


def due_before(now: datetime, days: int) -> datetime:
    """A job last verified before this time is due (``days`` > 0)."""
    return now - timedelta(days=days)


def is_due(last: datetime, now: datetime, days: int) -> bool:
    return days > 0 and last <= due_before(now, days)


@dataclass
class TokenBucket:
    """At most ``rate`` bytes per second, measured on the monotonic clock. The bucket starts
    empty and holds at most :data:`BURST_SECONDS` of bytes, so a scrub's reads over any stretch
    of a few seconds stay within the rate (a full bucket at the start would read a second's
    bytes at once and overshoot a short measurement). A read is charged after it happened:
    :meth:`charge` returns how long to sleep before the next one."""

    rate: float
    tokens: float = 0.0
    at: float | None = None

    def _refill(self, mono: float) -> None:
        if self.at is not None:
            cap = self.rate * BURST_SECONDS
            self.tokens = min(cap, self.tokens + (mono - self.at) * self.rate)
        self.at = mono

    def start(self, mono: float) -> None:
        """The clock starts now (before the first read)."""
        if self.at is None:
            self.at = mono

    def charge(self, size: int, mono: float) -> float:
        """``size`` bytes were read by ``mono``: the seconds to wait before the next read."""
        self._refill(mono)
        self.tokens -= size
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def sleeps(wait: float) -> list[float]:
    """A wait cut into sleeps of at most :data:`MAX_SLEEP_SECONDS` (checks in between)."""
    out: list[float] = []
    while wait > 1e-9:
        step = min(wait, MAX_SLEEP_SECONDS)
        out.append(step)
        wait -= step
    return out
