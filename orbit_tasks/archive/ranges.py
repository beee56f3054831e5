"""Fixed archive range of a job (SPEC §5). Pure: the store reads the inputs from database rows.

``until = job.created_at - archive_after_seconds`` of the job's frozen policy revision.
``from = until`` of the latest SUCCEEDED job of the same (namespace, kind) created before this one
(computed with *that* job's own policy revision), or ``None`` (the beginning of time).
The job archives exactly the roots with ``from <= settled < until``; empty when ``until <= from``.
"""

from __future__ import annotations

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
class RangeInputs:
    """What the store reads: this job's creation time and policy, and the previous success."""

    created_at: datetime
    archive_after_seconds: int
    previous_created_at: datetime | None = None
    previous_archive_after_seconds: int | None = None


def range_until(created_at: datetime, archive_after_seconds: int) -> datetime:
    return created_at - timedelta(seconds=archive_after_seconds)


def derive_range(inputs: RangeInputs) -> ArchiveRange:
    until = range_until(inputs.created_at, inputs.archive_after_seconds)
    if inputs.previous_created_at is None:
        return ArchiveRange(None, until)
    if inputs.previous_archive_after_seconds is None:
        raise ValueError("previous job given without its policy's archive_after_seconds")
    start = range_until(inputs.previous_created_at, inputs.previous_archive_after_seconds)
    return ArchiveRange(start, until)
