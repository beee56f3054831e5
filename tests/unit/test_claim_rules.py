"""Pure decisions of one archive claim (SPEC §5): strays, SOURCE_CHANGED, the file cap, the
stale writer's file, the read-ahead size."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest

from orbit_tasks.archive import claims as rules
from orbit_tasks.archive.claims import Fate
from orbit_tasks.archive.format.expectation import VerifyReport
from orbit_tasks.archive.jobs import ErrorCode, Job, JobFailure, JobState

SHA = "ab" * 32
M = f"00000000-{SHA}.json"
B1, B2, B3 = (f"0000000{i}-{SHA}.jsonl.gz" for i in (1, 2, 3))
T = datetime(2026, 1, 1)


def _report(**over: object) -> VerifyReport:
    base = VerifyReport(
        ok=True, first_bad_file=None, reason=None, batches=1, roots=5, bytes=10,
        last_sha256=SHA, final=False,
    )  # fmt: skip
    return replace(base, **over)  # type: ignore[arg-type]


def test_stray_names() -> None:
    tmp = ".tmp-00000002-x.jsonl.gz.1.ab"
    other_manifest = "00000000-" + "cd" * 32 + ".json"
    names = [M, other_manifest, B1, B2, tmp, "notes.txt"]
    # nothing confirmed yet: every chain-format name and temp file; foreign names stay
    assert rules.stray_names(names, None) == [M, other_manifest, B1, B2, tmp]
    report = _report(beyond=(B2,), strays=(other_manifest,))
    assert rules.stray_names(names, report) == [other_manifest, B2, tmp]
    assert rules.stray_names([M, B1], _report()) == []


def test_source_changed() -> None:
    assert not rules.source_changed(roots=10, roots_total=10, batches=2, tail_final=True)
    assert rules.source_changed(roots=9, roots_total=10, batches=2, tail_final=True)
    assert rules.source_changed(roots=11, roots_total=10, batches=2, tail_final=True)
    assert rules.source_changed(roots=10, roots_total=10, batches=2, tail_final=False)
    assert not rules.source_changed(roots=0, roots_total=0, batches=0, tail_final=False)
    assert rules.source_changed(roots=0, roots_total=3, batches=0, tail_final=False)
    assert rules.source_changed(roots=0, roots_total=None, batches=0, tail_final=False)


def test_fit_to_cap_halves_until_the_file_fits() -> None:
    built: list[tuple[int, bool]] = []

    def build(n: int, final: bool) -> bytes:
        built.append((n, final))
        return b"x" * (100 * n)

    assert rules.fit_to_cap(build, 10, True, cap=1000) == (b"x" * 1000, 10, True)  # == cap fits
    built.clear()
    data, roots, final = rules.fit_to_cap(build, 10, True, cap=999)
    assert (len(data), roots, final) == (500, 5, False) and built == [(10, True), (5, False)]
    assert rules.fit_to_cap(build, 7, False, cap=150)[1:] == (1, False)  # 7 -> 3 -> 1
    with pytest.raises(JobFailure) as err:
        rules.fit_to_cap(build, 4, True, cap=99)
    assert err.value.code is ErrorCode.ROOT_TOO_LARGE


def _job(state: JobState, batches: int, last: str = SHA) -> Job:
    return Job(
        namespace_id=b"\x01" * 16, id=b"\x02" * 16, kind="tasks", plan_revision=1,
        policy_revision=1, storage_id=b"\x03" * 16, batch_size=5, max_bytes=1 << 20,
        state=state, revision=1, attempts=1, batches=batches, roots=0, bytes=0, last_sha256=last,
        error_code="", lease_id=None, lease_until=None, created_at=T, updated_at=T,
    )  # fmt: skip


def test_unconfirmed_file_fate() -> None:
    assert rules.unconfirmed_file_fate(3, None) is Fate.REMOVE
    # ahead of a job a claim may still run (a live owner, or the next claim of a PENDING or
    # retried job, right after this row was read): it may confirm that very file
    for state in (JobState.RUNNING, JobState.PENDING, JobState.FAILED):
        assert rules.unconfirmed_file_fate(3, _job(state, 2)) is Fate.LEAVE
        assert rules.unconfirmed_file_fate(0, _job(state, 0, last="")) is Fate.LEAVE
    # ahead of a finished job: nobody can confirm it
    for state in (JobState.SUCCEEDED, JobState.ABANDONED):
        assert rules.unconfirmed_file_fate(3, _job(state, 2)) is Fate.REMOVE
        assert rules.unconfirmed_file_fate(0, _job(state, 0, last="")) is Fate.REMOVE
    # at a confirmed position: only if it is not the chain's file
    assert rules.unconfirmed_file_fate(2, _job(JobState.RUNNING, 2)) is Fate.REMOVE_IF_NOT_ON_CHAIN
    assert rules.unconfirmed_file_fate(1, _job(JobState.SUCCEEDED, 5)) is (
        Fate.REMOVE_IF_NOT_ON_CHAIN
    )


def test_read_ahead_roots() -> None:
    assert rules.read_ahead_roots(100, 0, 0) == 100  # nothing seen: one batch
    assert rules.read_ahead_roots(100, 500 * 100, 100) == rules.MAX_READ_AHEAD_ROOTS
    per_root = rules.READ_AHEAD_BYTES // 300  # 300 roots fill the byte budget
    assert rules.read_ahead_roots(10, per_root * 50, 50) == 300
    assert rules.read_ahead_roots(10, 20 * 1024 * 1024, 1) == 10  # huge roots: one batch


def test_group_has_room() -> None:
    mib = 1024 * 1024
    assert rules.group_has_room(0, 0, 100 * mib)  # the first file, whatever its size
    assert rules.group_has_room(1, 100, 100)
    assert rules.group_has_room(rules.GROUP_FILES - 1, 100, 100)
    assert not rules.group_has_room(rules.GROUP_FILES, 100, 100)  # full by count
    assert rules.group_has_room(1, rules.GROUP_BYTES - 100, 100)  # exactly the bytes: fits
    assert not rules.group_has_room(1, rules.GROUP_BYTES - 100, 101)  # full by bytes
    assert rules.group_has_room(0, 0, 100, controlled=True)
    assert not rules.group_has_room(1, 100, 100, controlled=True)  # a control: one file
