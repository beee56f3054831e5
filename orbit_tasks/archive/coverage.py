"""What the archive covers (issue 28 item 2), as pure rules: the archived range of each
SUCCEEDED job of a (namespace, kind), in order, and the gaps and overlaps between them.

A job's range is the one its manifest names. The database records its end (``orbit_archive_
job_ends``, or the policy's ``until`` for jobs from before p0006) but not its start: the start
is derived by the SPEC §5 rule (the greatest end among the SUCCEEDED jobs created before it),
which by construction leaves no gap among the jobs still in the database. The range a scrub read
from the manifest and proved with the chain (``orbit_archive_scrubs``) is the one the archive
really holds: where a scrub recorded it, it replaces the derived one, and a job row that went
missing since shows as the gap it left (``range_source`` says which one a range is).

No I/O: the store reads one row per job (``store/coverage.py``), the CLI words the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from orbit_tasks.archive.ranges import Bound, bound_key, range_until


class RangeSource(StrEnum):
    SCRUB = "scrub"  # the manifest's range, recorded by the latest scrub that verified the job
    DERIVED = "derived"  # the SPEC §5 rule over the database rows


class HoleKind(StrEnum):
    GAP = "gap"
    OVERLAP = "overlap"


@dataclass(frozen=True)
class CoveredJob:
    """One SUCCEEDED job as the store reads it."""

    job_id: bytes
    created_at: datetime
    succeeded_at: datetime
    storage_id: bytes
    roots: int
    batches: int
    bytes: int
    archive_after_seconds: int | None  # None: its policy revision row is gone
    recorded_end: Bound | None  # orbit_archive_job_ends (None: a job from before p0006)
    verified_start: Bound | None = None  # the manifest's, as the latest verifying scrub read it
    verified_end: Bound | None = None  # (None with ``verified_end`` None: never scrubbed)
    verified_at: datetime | None = None
    checked_at: datetime | None = None
    outcome: str | None = None  # of the latest scrub (None: never scrubbed)
    first_bad_file: str = ""


@dataclass(frozen=True)
class ArchivedRange:
    job: CoveredJob
    start: Bound | None  # None: the beginning of time
    end: Bound | None  # None: unknown (no recorded end and no policy row)
    source: RangeSource

    @property
    def empty(self) -> bool:
        if self.end is None:
            return False
        return self.start is not None and bound_key(self.end) <= bound_key(self.start)

    @property
    def last_verified(self) -> datetime:
        """The latest verification of the job's chain: its latest verifying scrub, else the
        runner's own at its success."""
        return self.job.verified_at or self.job.succeeded_at


@dataclass(frozen=True)
class Hole:
    """A stretch of settled history two neighbouring ranges do not agree on."""

    kind: HoleKind
    start: Bound | None  # None: the beginning of time
    end: Bound
    before: bytes | None  # the job whose range ends at the hole (None: none before it)
    after: bytes  # the job whose range starts there


def _max(a: Bound | None, b: Bound | None) -> Bound | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b, key=bound_key)


def archived_ranges(jobs: Sequence[CoveredJob]) -> list[ArchivedRange]:
    """The range of each job, ``jobs`` in creation order (created_at, id): the verified one
    where a scrub recorded it, else the SPEC §5 derivation (its start the greatest end of the
    jobs before it, its end the recorded one or its policy's ``until``)."""
    out: list[ArchivedRange] = []
    greatest: Bound | None = None
    for job in jobs:
        end = job.recorded_end
        if end is None and job.archive_after_seconds is not None:
            end = (range_until(job.created_at, job.archive_after_seconds), None)
        if job.verified_end is not None:
            out.append(ArchivedRange(job, job.verified_start, job.verified_end, RangeSource.SCRUB))
        else:
            out.append(ArchivedRange(job, greatest, end, RangeSource.DERIVED))
        greatest = _max(greatest, end)
    return out


def _start_key(r: ArchivedRange) -> tuple[int, tuple[datetime, bytes] | None]:
    return (0, None) if r.start is None else (1, bound_key(r.start))


def holes(ranges: Sequence[ArchivedRange]) -> list[Hole]:
    """Gaps and overlaps among the non-empty ranges of known end, taken in the order of their
    starts: history from the beginning of time up to the last end must be covered exactly
    once."""
    known = sorted((r for r in ranges if r.end is not None and not r.empty), key=_start_key)
    out: list[Hole] = []
    covered: Bound | None = None  # everything before it is covered (None: nothing yet)
    before: bytes | None = None
    first = True
    for r in known:
        assert r.end is not None
        if first:
            if r.start is not None:
                out.append(Hole(HoleKind.GAP, None, r.start, None, r.job.job_id))
            first = False
        elif covered is not None and r.start is not None:
            if bound_key(r.start) > bound_key(covered):
                out.append(Hole(HoleKind.GAP, covered, r.start, before, r.job.job_id))
            elif bound_key(r.start) < bound_key(covered):
                top = min(covered, r.end, key=bound_key)
                out.append(Hole(HoleKind.OVERLAP, r.start, top, before, r.job.job_id))
        elif covered is not None and r.start is None:  # a second range from the beginning
            top = min(covered, r.end, key=bound_key)
            out.append(Hole(HoleKind.OVERLAP, None, top, before, r.job.job_id))
        if covered is None or bound_key(r.end) > bound_key(covered):
            covered, before = r.end, r.job.job_id
    return out
