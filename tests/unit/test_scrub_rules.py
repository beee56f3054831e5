"""The pure rules of issue 28 items 2 and 3: when a job is due for its scrub, the token bucket
of the read rate, and the gaps and overlaps between archived ranges."""

from __future__ import annotations

import datetime as dt

import pytest

from orbit_tasks.archive import coverage as cov
from orbit_tasks.archive.scrubs import (
    BURST_SECONDS,
    TokenBucket,
    is_due,
    last_verified,
    sleeps,
)
from orbit_tasks.errors import InvalidInput
from orbit_tasks.settings import load_settings

T0 = dt.datetime(2026, 1, 1)


def test_a_job_is_due_one_period_after_its_last_verification() -> None:
    succeeded, verified = T0, T0 + dt.timedelta(days=10)
    assert last_verified(succeeded, None, scrubbed=False) == succeeded
    assert last_verified(succeeded, None, scrubbed=True) == succeeded  # every scrub failed
    assert last_verified(succeeded, verified, scrubbed=True) == verified
    now = verified + dt.timedelta(days=30)
    assert is_due(verified, now, 30) and not is_due(verified, now - dt.timedelta(seconds=1), 30)
    assert not is_due(T0, now, 0)  # off


def test_the_bucket_starts_empty_and_keeps_the_rate_over_any_stretch() -> None:
    rate = 1000.0
    bucket = TokenBucket(rate)
    bucket.start(0.0)
    assert bucket.charge(500, 0.0) == pytest.approx(0.5)  # nothing saved up at the start
    # reads of 100 bytes as fast as allowed: time advances only by the waits
    mono, read = 0.5, 500
    for _ in range(50):
        mono += bucket.charge(100, mono)
        read += 100
    assert read / mono == pytest.approx(rate, rel=0.01)
    # after a long pause only BURST_SECONDS of bytes come free
    idle = mono + 60
    assert bucket.charge(int(rate * BURST_SECONDS), idle) == 0.0
    assert bucket.charge(100, idle) == pytest.approx(0.1)


def test_a_wait_is_slept_in_steps_of_at_most_a_second() -> None:
    assert sleeps(2.5) == [1.0, 1.0, 0.5] and sleeps(0.0) == []


def _job(i: int, end_minutes: int, after: int | None = 3600, **kw: object) -> cov.CoveredJob:
    created = T0 + dt.timedelta(hours=i)
    end = T0 + dt.timedelta(minutes=end_minutes)
    return cov.CoveredJob(
        job_id=bytes([i]) * 16, created_at=created, succeeded_at=created, storage_id=b"s" * 16,
        roots=1, batches=1, bytes=10, archive_after_seconds=after, recorded_end=(end, None),
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _at(minutes: int) -> tuple[dt.datetime, None]:
    return (T0 + dt.timedelta(minutes=minutes), None)


def test_derived_ranges_follow_each_other_and_leave_no_hole() -> None:
    ranges = cov.archived_ranges([_job(1, 10), _job(2, 20), _job(3, 30)])
    assert [(r.start, r.end) for r in ranges] == [
        (None, _at(10)), (_at(10), _at(20)), (_at(20), _at(30)),
    ]  # fmt: skip
    assert all(r.source is cov.RangeSource.DERIVED for r in ranges)
    assert cov.holes(ranges) == []


def test_a_proven_range_after_a_missing_job_is_a_gap_and_a_double_one_an_overlap() -> None:
    proven = _job(3, 30, verified_start=_at(20), verified_end=_at(30))
    ranges = cov.archived_ranges([_job(1, 10), proven])  # job 2 ([10, 20)) is gone
    (gap,) = cov.holes(ranges)
    assert (gap.kind, gap.start, gap.end) == (cov.HoleKind.GAP, _at(10), _at(20))
    assert (gap.before, gap.after) == (bytes([1]) * 16, bytes([3]) * 16)
    twice = _job(4, 40, verified_start=_at(25), verified_end=_at(40))
    (over,) = cov.holes(cov.archived_ranges([_job(1, 10), _job(2, 30), twice]))
    assert (over.kind, over.start, over.end) == (cov.HoleKind.OVERLAP, _at(25), _at(30))
    first_gone = _job(2, 20, verified_start=_at(10), verified_end=_at(20))
    (lead,) = cov.holes(cov.archived_ranges([first_gone]))
    assert (lead.kind, lead.start, lead.end, lead.before) == (cov.HoleKind.GAP, None, _at(10), None)


def test_an_empty_range_and_an_unknown_end_are_listed_not_holes() -> None:
    empty = _job(2, 5)  # ends before the first job's end: an empty range (a shortened policy)
    unknown = cov.CoveredJob(
        job_id=b"\x09" * 16, created_at=T0, succeeded_at=T0, storage_id=b"s" * 16, roots=0,
        batches=0, bytes=0, archive_after_seconds=None, recorded_end=None,
    )  # fmt: skip
    ranges = cov.archived_ranges([_job(1, 10), empty, unknown, _job(3, 20)])
    assert ranges[1].empty and ranges[2].end is None
    assert cov.holes(ranges) == []


@pytest.mark.parametrize(
    ("env", "days", "rate"),
    [
        ({}, 30, 8 * 1024**2),
        ({"ORBIT_ARCHIVE_SCRUB_DAYS": "off"}, 0, 8 * 1024**2),
        ({"ORBIT_ARCHIVE_SCRUB_DAYS": "0", "ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND": "2MiB/s"}, 0,
         2 * 1024**2),
        ({"ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND": "64KiB"}, 30, 65536),
    ],
)  # fmt: skip
def test_scrub_settings(env: dict[str, str], days: int, rate: int) -> None:
    s = load_settings(env)
    assert (s.archive_scrub_days, s.archive_scrub_bytes_per_second) == (days, rate)
    assert s.archive_scrub_repair is False


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("ORBIT_ARCHIVE_SCRUB_DAYS", "3651", "allowed 0..3650"),
        ("ORBIT_ARCHIVE_SCRUB_DAYS", "monthly", "not an integer"),
        ("ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND", "1KiB/s", "allowed 64KiB..1GiB per second"),
        ("ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND", "fast", "is not a size per second"),
        # a bare number is refused, as every size (issue 27's one vocabulary)
        ("ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND", "65536", "is not a size per second"),
        ("ORBIT_ARCHIVE_SCRUB_REPAIR", "maybe", "allowed 1, 0"),
    ],
)
def test_bad_scrub_settings_name_the_variable_and_the_range(
    name: str, value: str, needle: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings({name: value})
    assert name in str(err.value) and needle in str(err.value)
