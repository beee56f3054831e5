"""Pure archive-job rules at their exact boundaries (SPEC §5)."""

from __future__ import annotations

import errno
from datetime import datetime, timedelta

import pytest

from orbit_tasks import failpoints
from orbit_tasks.archive.claims import MAX_FILE_BYTES, file_cap, is_stalled, over_budget
from orbit_tasks.archive.jobs import (
    ErrorCode,
    JobState,
    check_abandon,
    check_expected_revision,
    check_retry,
    claimable,
    is_takeover,
    lease_expired,
)
from orbit_tasks.archive.ranges import (
    BUDGET_MARGIN,
    MANIFEST_SLACK,
    ArchiveRange,
    EarlierSuccess,
    RangeInputs,
    bound_key,
    cut_short,
    derive_range,
    end_between,
    range_from,
    roots_within_budget,
    start_bound,
)
from orbit_tasks.errors import IllegalState, InvalidInput, StaleRevision

NOW = datetime(2026, 11, 29, 12, 0, 0, 500000)
US = timedelta(microseconds=1)
MiB = 1024 * 1024


def test_error_vocabulary_is_exactly_the_spec() -> None:
    assert {c.value for c in ErrorCode} == {
        "STORAGE_MISMATCH",
        "CHAIN_BROKEN",
        "BUDGET_EXCEEDED",
        "DISK_FULL",
        "IO_ERROR",
        "SOURCE_INVALID",
        "SOURCE_CHANGED",
        "ROOT_TOO_LARGE",
        "POLICY_MISSING",
        "STALLED",
        "ACCESS_DENIED",
        "NO_SUCH_BUCKET",
    }
    assert [s.value for s in JobState] == [
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "ABANDONED",
    ]


def test_lease_expiry_boundary() -> None:
    assert not lease_expired(NOW, NOW)  # equal: still owned
    assert lease_expired(NOW - US, NOW)  # one microsecond past: expired
    assert not lease_expired(NOW + US, NOW)
    assert not lease_expired(None, NOW)


def test_claimable_states() -> None:
    assert claimable(JobState.PENDING, None, NOW)
    assert not claimable(JobState.RUNNING, NOW, NOW)
    assert claimable(JobState.RUNNING, NOW - US, NOW)
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.ABANDONED):
        assert not claimable(state, None, NOW)
        assert not claimable(state, NOW - US, NOW)
    assert is_takeover(JobState.RUNNING) and not is_takeover(JobState.PENDING)


def test_stall_rule_boundary() -> None:
    # attempts counted after the takeover's increment; batches confirmed so far
    assert not is_stalled(attempts=5, batches=4, max_stalls=1)  # healthy: attempts == batches+1
    assert is_stalled(attempts=6, batches=4, max_stalls=1)  # one claim confirmed nothing
    assert not is_stalled(attempts=24, batches=4, max_stalls=20)  # 19 stalls
    assert is_stalled(attempts=25, batches=4, max_stalls=20)  # exactly 20 stalls
    assert is_stalled(attempts=26, batches=4, max_stalls=20)


def test_budget_boundary() -> None:
    assert not over_budget(bytes_so_far=MiB - 100, size=100, max_bytes=MiB)  # == is fine
    assert over_budget(bytes_so_far=MiB - 100, size=101, max_bytes=MiB)  # +1 fails
    assert not over_budget(0, 0, MiB)
    assert file_cap(MiB) == MiB // 4
    assert file_cap(256 * MiB) == MAX_FILE_BYTES == 64 * MiB
    assert file_cap(1024 * MiB) == MAX_FILE_BYTES


def test_retry_transitions() -> None:
    assert check_retry(JobState.FAILED, 2 * MiB, None) == 2 * MiB
    assert check_retry(JobState.FAILED, 2 * MiB, 2 * MiB) == 2 * MiB  # equal is not lower
    assert check_retry(JobState.FAILED, 2 * MiB, 3 * MiB) == 3 * MiB
    with pytest.raises(InvalidInput, match="lower than the job's max_bytes"):
        check_retry(JobState.FAILED, 2 * MiB, 2 * MiB - 1)
    with pytest.raises(InvalidInput, match="out of range"):
        check_retry(JobState.FAILED, 2 * MiB, 1024 * MiB + 1)
    for state in (JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED, JobState.ABANDONED):
        with pytest.raises(IllegalState):
            check_retry(state, 2 * MiB, None)


def test_abandon_transitions() -> None:
    check_abandon(JobState.FAILED, None, NOW)
    check_abandon(JobState.PENDING, None, NOW)
    check_abandon(JobState.RUNNING, NOW - US, NOW)  # lease expired
    with pytest.raises(IllegalState, match="live lease"):
        check_abandon(JobState.RUNNING, NOW, NOW)  # lease_until == now is still live
    for state in (JobState.SUCCEEDED, JobState.ABANDONED):
        with pytest.raises(IllegalState):
            check_abandon(state, None, NOW)


def test_expected_revision() -> None:
    check_expected_revision(7, None)
    check_expected_revision(7, 7)
    with pytest.raises(StaleRevision, match="expect_revision 6"):
        check_expected_revision(7, 6)


def test_range_first_job_starts_at_the_beginning_of_time() -> None:
    rng = derive_range(RangeInputs(created_at=NOW, archive_after_seconds=3600))
    assert rng == ArchiveRange(None, NOW - timedelta(hours=1))
    assert not rng.empty
    assert rng.contains(datetime(1970, 1, 1))
    assert rng.contains(NOW - timedelta(hours=1) - US)
    assert not rng.contains(NOW - timedelta(hours=1))  # until is exclusive


def _after(created: datetime, seconds: int) -> EarlierSuccess:
    return EarlierSuccess(created, seconds)


def test_chained_ranges_meet_exactly() -> None:
    first = derive_range(RangeInputs(NOW, 3600))
    later = NOW + timedelta(days=1)
    second = derive_range(RangeInputs(later, 7200, (_after(NOW, 3600),)))
    assert second.from_ == first.until  # computed with the previous job's own policy
    assert second.until == later - timedelta(hours=2)
    boundary = first.until
    assert not first.contains(boundary) and second.contains(boundary)  # from is inclusive
    assert first.contains(boundary - US) and not second.contains(boundary - US)


def test_empty_range_when_until_not_after_from() -> None:
    # the policy got longer: the new until falls before the previous job's until
    rng = derive_range(RangeInputs(NOW, 7200, (_after(NOW - timedelta(minutes=30), 3600),)))
    assert rng.until < rng.from_  # type: ignore[operator]
    assert rng.empty
    equal = derive_range(RangeInputs(NOW, 3600, (_after(NOW, 3600),)))
    assert equal.empty and not equal.contains(equal.until - US)
    one_us = derive_range(RangeInputs(NOW + US, 3600, (_after(NOW, 3600),)))
    assert not one_us.empty and one_us.contains(one_us.from_)  # type: ignore[arg-type]


def test_from_is_the_greatest_until_of_all_earlier_successes() -> None:
    """Policy 1h -> 30d -> 1h: the 30d job's until lies far behind the first job's; the third
    job starts at the first job's until, not at the latest success's (SPEC §5, issue 7)."""
    a, b, c = NOW, NOW + timedelta(days=1), NOW + timedelta(days=2)
    first = derive_range(RangeInputs(a, 3600))
    lengthened = derive_range(RangeInputs(b, 30 * 86400, (_after(a, 3600),)))
    assert lengthened.empty and lengthened.from_ == first.until
    shortened = derive_range(RangeInputs(c, 3600, (_after(b, 30 * 86400), _after(a, 3600))))
    assert shortened.from_ == first.until  # not b - 30d, which would re-archive a's roots
    assert shortened == derive_range(RangeInputs(c, 3600, (_after(a, 3600), _after(b, 2592000))))
    assert range_from([]) is None
    assert range_from([_after(a, 3600), _after(a - US, 3600)]) == a - timedelta(hours=1)


def test_failpoints_inert_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    assert failpoints.hit("archive.after_file_write") is None  # returns immediately
    monkeypatch.setenv(failpoints.ENV, "archive.other=oserror:EIO")
    assert failpoints.hit("archive.after_file_write") is None  # not this point: returns
    with pytest.raises(OSError) as fired:  # ... while the point that is named does fire
        failpoints.hit("archive.other")
    assert fired.value.errno == errno.EIO


def test_parse_volumes_env() -> None:
    from pathlib import Path

    from orbit_tasks.archive.engine.runner import parse_volumes

    hex_id = "0123456789abcdef0123456789ABCDEF"
    assert parse_volumes(None) == {}
    assert parse_volumes("") == {}
    assert parse_volumes(f'{{"{hex_id}": "/mnt/a"}}') == {hex_id.lower(): Path("/mnt/a")}
    for bad in ("[1]", "not json", '{"xyz": "/mnt/a"}'):
        with pytest.raises(InvalidInput):
            parse_volumes(bad)


# --- budget-sized ranges (SPEC §5 catch-up) -------------------------------------------------------


def test_recorded_ends_are_keys_and_a_plain_time_sorts_before_every_id() -> None:
    """The greatest recorded end of the earlier successes is the next ``from``, compared as keys
    (settled, id); a recorded end replaces the job's own policy ``until``; a job from before the
    table (no recorded end) counts with its policy's ``until``."""
    t = NOW - timedelta(days=3)
    a, b = b"\x00" * 15 + b"\x05", b"\x00" * 15 + b"\x09"
    rng = derive_range(RangeInputs(NOW, 3600, (), (t, a), (t, b)))
    assert (rng.from_, rng.from_id, rng.until, rng.until_id) == (t, a, t, b)
    assert rng.contains(t, a) and rng.contains(t, b"\x00" * 15 + b"\x08")
    assert not rng.contains(t, b) and not rng.contains(t - US, b"\xff" * 16)
    assert rng.keyed and not rng.empty
    assert start_bound([], (t, None)) == (t, None)
    assert bound_key((t, None)) < bound_key((t, a)) < bound_key((t, b))
    # an old success whose policy until lies beyond the recorded key end wins, and vice versa
    old = _after(t + timedelta(hours=2), 3600)  # until = t + 1h
    assert start_bound([old], (t, b)) == (t + timedelta(hours=1), None)
    assert start_bound([_after(t, 3600)], (t, b)) == (t, b)
    # a recorded end at a plain time, equal to a key's time, is the smaller one
    assert derive_range(RangeInputs(NOW, 3600, (), (t, a), (t, None))).empty


def test_the_cut_keeps_one_settled_time_together_unless_it_must_split_it() -> None:
    t = NOW - timedelta(days=1)
    a, b = b"\x00" * 15 + b"\x01", b"\x00" * 15 + b"\x02"
    assert end_between((t, a), (t + US, a)) == (t + US, None)  # a plain time: nothing split
    assert end_between((t, a), (t, b)) == (t, b)  # one microsecond: a key
    assert cut_short((t, b), t + US) and cut_short((t, None), t + US)
    assert not cut_short((t, None), t)


def test_roots_within_budget_keeps_a_margin_and_at_least_one_root() -> None:
    mib = 1024 * 1024
    fits = roots_within_budget(mib, 4000, 100.0)
    assert fits == int((mib - 4000 - MANIFEST_SLACK) / (100.0 * BUDGET_MARGIN))
    assert fits * 100.0 * BUDGET_MARGIN <= mib - 4000
    assert roots_within_budget(mib, 4000, 10.0 * mib) == 1
    assert roots_within_budget(mib, 4000, 0.0) >= 1
