"""Fixed archive range of a job (SPEC §5). Pure: the store reads the inputs from database rows.

``until = job.created_at - archive_after_seconds`` of the job's frozen policy revision, or the
job's *recorded* end when it has one (SPEC §5 "Budget-sized ranges": before its first batch a
job whose range would not fit its ``max_bytes`` ends earlier, and records that end).
``from`` = the greatest end among all SUCCEEDED jobs of the same (namespace, kind) created
before this one -- the recorded end of each that has one, else its ``until`` computed with *its
own* policy revision -- or ``None`` (the beginning of time). Not the latest success's end: after
a policy was lengthened and shortened again (1h -> 30d -> 1h) the latest success can end behind
an earlier one, and a range starting there would archive the earlier job's roots a second time.

A bound is a *key* ``(settled, id)``: ``id`` None is a plain settled time, which sorts before
every root settled at that time (so ``until = (T, None)`` is ``settled < T``, and a key end
``(T, I)`` splits the roots settled at ``T`` between two jobs). The job archives exactly the
roots with ``from <= (settled, id) < until``; empty when ``until <= from``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

#: A range bound: a settled time, and the id of the root it starts at (None: a plain time).
Bound = tuple[datetime, bytes | None]

#: The measured bytes per root are multiplied by this before a range is cut to its budget:
#: rows of one range vary in size, and the sample is a few hundred of its roots.
BUDGET_MARGIN = 1.25
#: Bytes kept free beside the manifest measured before the cut (a cut range's manifest names
#: its end as a key, and its ``roots_total`` is another number).
MANIFEST_SLACK = 512


def bound_key(bound: Bound) -> tuple[datetime, bytes]:
    """A bound as a comparable key: a plain time sorts before every id at that time."""
    return bound[0], bound[1] or b""


@dataclass(frozen=True)
class ArchiveRange:
    from_: datetime | None
    until: datetime
    from_id: bytes | None = None  # with ``from_``: the range starts at the key (from_, from_id)
    until_id: bytes | None = None  # with ``until``: the range ends before the key (until, id)

    @property
    def start(self) -> Bound | None:
        return None if self.from_ is None else (self.from_, self.from_id)

    @property
    def end(self) -> Bound:
        return self.until, self.until_id

    @property
    def empty(self) -> bool:
        start = self.start
        return start is not None and bound_key(self.end) <= bound_key(start)

    @property
    def keyed(self) -> bool:
        """A bound is a key (settled, id), not a plain time."""
        return self.from_id is not None or self.until_id is not None

    def contains(self, settled: datetime, root_id: bytes = b"") -> bool:
        if self.empty:
            return False
        key = (settled, root_id)
        start = self.start
        return (start is None or bound_key(start) <= key) and key < bound_key(self.end)

    def ending_at(self, end: Bound) -> ArchiveRange:
        """The same range with another end."""
        return ArchiveRange(self.from_, end[0], self.from_id, end[1])


@dataclass(frozen=True)
class EarlierSuccess:
    """A SUCCEEDED job of the same (namespace, kind) created before the job: when it was created
    and its own policy's ``archive_after_seconds``."""

    created_at: datetime
    archive_after_seconds: int


@dataclass(frozen=True)
class RangeInputs:
    """What the store reads: this job's creation time, policy and recorded end (None: none yet),
    and the earlier successes: those without a recorded end (any subset that contains, per
    policy revision, the latest-created success suffices), and the greatest recorded end."""

    created_at: datetime
    archive_after_seconds: int
    earlier_successes: tuple[EarlierSuccess, ...] = ()
    earlier_end: Bound | None = None
    recorded_end: Bound | None = None


def range_until(created_at: datetime, archive_after_seconds: int) -> datetime:
    return created_at - timedelta(seconds=archive_after_seconds)


def range_from(earlier_successes: Iterable[EarlierSuccess]) -> datetime | None:
    """The greatest ``until`` of earlier successes without a recorded end, ``None`` when there
    is none."""
    untils = [range_until(e.created_at, e.archive_after_seconds) for e in earlier_successes]
    return max(untils, default=None)


def start_bound(
    earlier_successes: Iterable[EarlierSuccess], earlier_end: Bound | None = None
) -> Bound | None:
    """The greatest end of the earlier successes (their policy ``until`` or their recorded
    end), ``None`` when there is none."""
    untils = range_from(earlier_successes)
    ends: list[Bound] = [] if untils is None else [(untils, None)]
    if earlier_end is not None:
        ends.append(earlier_end)
    return max(ends, key=bound_key, default=None)


def derive_range(inputs: RangeInputs) -> ArchiveRange:
    start = start_bound(inputs.earlier_successes, inputs.earlier_end)
    end: Bound = inputs.recorded_end or (
        range_until(inputs.created_at, inputs.archive_after_seconds),
        None,
    )
    if start is None:
        return ArchiveRange(None, end[0], None, end[1])
    return ArchiveRange(start[0], end[0], start[1], end[1])


def cut_short(end: Bound, policy_until: datetime) -> bool:
    """A recorded end before the policy's ``until``: the range was cut to its budget, and more
    history the policy lets go is still waiting (SPEC §5 catch-up)."""
    return bound_key(end) < (policy_until, b"")


def roots_within_budget(max_bytes: int, manifest_bytes: int, bytes_per_root: float) -> int:
    """How many roots a range may hold so that its files fit ``max_bytes``: the room left
    beside the manifest over the measured bytes per root with :data:`BUDGET_MARGIN` (at least
    one root: a root larger than a file is ``ROOT_TOO_LARGE``, not a range to cut)."""
    room = max_bytes - manifest_bytes - MANIFEST_SLACK
    if bytes_per_root <= 0:
        return max(1, room)
    return max(1, math.floor(room / (bytes_per_root * BUDGET_MARGIN)))


def end_between(last_in: tuple[datetime, bytes], first_out: tuple[datetime, bytes]) -> Bound:
    """The end of a range whose last root is ``last_in`` and whose next root (left to the next
    job) is ``first_out``: a plain settled time when they are settled at different times, so
    roots sharing one settled time stay in one job whenever they can; the key of ``first_out``
    when both share one settled time (a burst in one microsecond larger than a budget)."""
    if last_in[0] < first_out[0]:
        return first_out[0], None
    return first_out[0], first_out[1]
