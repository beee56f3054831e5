"""Fixed archive range of a job (SPEC §5). Pure: the store reads the inputs from database rows.

``until = job.created_at - archive_after_seconds`` of the job's frozen policy revision.
``from`` = the greatest ``until`` among all SUCCEEDED jobs of the same (namespace, kind) created
before this one (each computed with *that* job's own policy revision), or ``None`` (the beginning
of time). Not the latest success's ``until``: after a policy was lengthened and shortened again
(1h -> 30d -> 1h) the latest success can end behind an earlier one, and a range starting there
would archive the earlier job's roots a second time.
The job archives exactly the roots with ``from <= settled < until``; empty when ``until <= from``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class ArchiveRange:
    from_: datetime | None
    until: datetime

    @property
    def empty(self) -> bool:
        return self.from_ is not None and self.until <= self.from_

    def contains(self, settled: datetime) -> bool:
        if self.empty:
            return False
        return (self.from_ is None or self.from_ <= settled) and settled < self.until


@dataclass(frozen=True)
class EarlierSuccess:
    """A SUCCEEDED job of the same (namespace, kind) created before the job: when it was created
    and its own policy's ``archive_after_seconds``."""

    created_at: datetime
    archive_after_seconds: int


@dataclass(frozen=True)
class RangeInputs:
    """What the store reads: this job's creation time and policy, and the earlier successes
    (any subset that contains, per policy revision, the latest-created success suffices)."""

    created_at: datetime
    archive_after_seconds: int
    earlier_successes: tuple[EarlierSuccess, ...] = ()


def range_until(created_at: datetime, archive_after_seconds: int) -> datetime:
    return created_at - timedelta(seconds=archive_after_seconds)


def range_from(earlier_successes: Iterable[EarlierSuccess]) -> datetime | None:
    """The greatest ``until`` of the earlier successes, ``None`` when there is none."""
    untils = [range_until(e.created_at, e.archive_after_seconds) for e in earlier_successes]
    return max(untils, default=None)


def derive_range(inputs: RangeInputs) -> ArchiveRange:
    until = range_until(inputs.created_at, inputs.archive_after_seconds)
    return ArchiveRange(range_from(inputs.earlier_successes), until)
