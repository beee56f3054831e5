"""Group durability under faults (issue 25), with real `celery worker` processes: a claim chain
writes a group of batch files (each synced, one directory sync), confirms the group with ONE
fenced statement, and writes the next group ahead of that confirm (SPEC §5 allows files beyond
the confirmed prefix; step 2, step 6 and the final step remove them).

Every slow write (``volume.before_publish=sleep``) lets the reader run ahead, so the groups
fill; every test ends with the chain verifying from disk, every root of the range archived
once, and the job directory holding exactly the chain (no leftover after the final step).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from orbit_tasks.archive.claims import GROUP_FILES
from orbit_tasks.archive.engine import budget
from orbit_tasks.archive.format.batch import decode_batch
from orbit_tasks.archive.format.names import parse_name, tail_name
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.faults.test_archive_faults import _seed_big
from tests.support.archive_jobs import (
    ArchiveEnv,
    MiB,
    archive_env,
    assert_succeeded_exactly,
    create_job,
    file_snapshot,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_for,
    wait_marker,
    wait_state,
)

pytestmark = [pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

DONE = {JobState.SUCCEEDED, JobState.FAILED}
SLOW_WRITE = "volume.before_publish=sleep:0.1"  # the reader gets ahead: the next group fills


@pytest.fixture
def ae(platform_engine: Engine, mariadb_url: str, tmp_path: Path) -> Iterator[ArchiveEnv]:
    # the longest slice the test lease allows: a claim from PENDING starts with a group of one
    # file (the reader's first query asks for one batch), so a release after every group would
    # leave groups of one on a loaded machine
    with archive_env(
        mariadb_url, platform_engine, tmp_path, ORBIT_ARCHIVE_SLICE_SECONDS="3"
    ) as env:
        yield env


def _setup(ae: ArchiveEnv, name: str, roots: int = 80, batch: int = 5, **plan: Any) -> tuple:
    ns, q = make_namespace(ae.engine, name)
    vol = ae.tmp / f"vol-{name}"
    sid = make_volume(ae.engine, vol, name)
    make_plan(ae.engine, ns, "tasks", sid, batch_size=batch, **plan)
    seed(ae.engine, ns, q, "tasks", roots)
    return ns, q, vol, sid


def _confirmed(snapshot: dict[str, bytes], job: Job) -> dict[str, bytes]:
    """The files of ``snapshot`` on the confirmed prefix of ``job`` (walked back from its tail)."""
    if not job.has_manifest:
        return {}
    names: dict[str, bytes] = {}
    seq, sha = job.batches, job.last_sha256
    while True:
        name = tail_name(seq, sha)
        names[name] = snapshot[name]
        if seq == 0:
            return names
        sha = decode_batch(snapshot[name]).header["prev_sha256"]
        seq -= 1


def _beyond(vol: Path, job: Job) -> dict[str, bytes]:
    """The files of the job directory beyond its confirmed prefix (each past its tail)."""
    files = file_snapshot(vol, job)
    confirmed = _confirmed(files, job)
    ahead = {n: d for n, d in files.items() if n not in confirmed}
    for name in ahead:
        parsed = parse_name(name)
        assert parsed is not None and parsed.seq > job.batches, (name, job.batches)
    return ahead


def _assert_kept(vol: Path, job: Job, confirmed: dict[str, bytes]) -> None:
    now = file_snapshot(vol, job)
    for name, data in confirmed.items():
        assert now.get(name) == data, f"confirmed file {name} was deleted or rewritten"


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_sigkill_with_a_group_written_and_unconfirmed_then_takeover(ae: ArchiveEnv) -> None:
    """Killed with the second group durable and not confirmed (several files beyond the
    prefix): the takeover removes them all, writes them again and finishes; one claim died."""
    ns, _, vol, _ = _setup(ae, "gkill")
    marker = ae.tmp / "marker"
    points = f"{SLOW_WRITE};archive.after_group_write=pause@2:{marker}"
    victim = ae.worker("victim", [vol], failpoints=points)
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)
    victim.signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    at_kill = ae.job(ns, job.id)
    assert at_kill.state is JobState.RUNNING and at_kill.batches >= 1  # group 1 confirmed
    # the group confirmed by one statement counted the claims its files chained, and the live one
    assert at_kill.attempts == at_kill.batches + 2
    ahead = _beyond(vol, at_kill)
    assert 2 <= len(ahead) <= GROUP_FILES, sorted(ahead)  # the unconfirmed group
    confirmed = _confirmed(file_snapshot(vol, job), at_kill)
    ae.worker("rescuer", [vol])
    done = wait_state(ae, job, DONE, timeout=90)
    assert done.state is JobState.SUCCEEDED, done
    assert done.attempts == done.batches + 2  # the killed claim confirmed nothing
    _assert_kept(vol, job, confirmed)
    assert_succeeded_exactly(ae, done, vol)


def test_lease_lost_with_groups_written_ahead_removes_only_its_own_files(ae: ArchiveEnv) -> None:
    """A worker stopped just before the confirm of its second group -- that group durable, the
    third being written ahead -- loses its lease; the new owner takes over (removing those
    files as leftovers) and finishes the job, writing the same names again. When the stale
    worker comes back its confirm is rejected and step 6 removes only inodes it created: every
    confirmed file stays, and nothing else is left."""
    ns, _, vol, _ = _setup(ae, "glost")
    marker = ae.tmp / "stopped"
    # solo pool: the stopped process is the worker itself; confirms: the manifest, group 1, ...
    stale = ae.worker(
        "stale", [vol], failpoints=f"{SLOW_WRITE};archive.before_confirm=stop@3:{marker}",
        pool="solo",
    )  # fmt: skip
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)
    wait_for(lambda: _is_stopped(stale.proc.pid), 10, "SIGSTOP")
    at_stop = ae.job(ns, job.id)
    stale_files = _beyond(vol, at_stop)
    assert len(stale_files) >= 2, sorted(stale_files)  # group 2 (and what of group 3 was out)
    ae.worker("owner", [vol])
    done = wait_state(ae, job, DONE, timeout=90)
    assert done.state is JobState.SUCCEEDED, done
    confirmed = file_snapshot(vol, done)
    stale.signal(signal.SIGCONT)
    wait_for(lambda: "archive.job.lease_lost" in stale.text(), 30, "stale confirm rejected")
    _assert_kept(vol, done, confirmed)
    assert_succeeded_exactly(ae, done, vol)


def test_budget_refused_within_groups_confirms_the_files_before_it(ae: ArchiveEnv) -> None:
    """The budget is checked before every file, counting the files written ahead of their
    confirm: 100 fat roots settled between two of the budget sample's points (the range is not
    cut for them, as in ``test_budget_exceeded_then_retry_with_a_higher_budget``) outgrow the
    budget while groups are written. The file that does not fit is never written; the files
    admitted before it are confirmed, then the job fails BUDGET_EXCEEDED with nothing beyond its
    confirmed prefix, which verifies."""
    ns, q, vol, _ = _setup(ae, "gbudget", roots=2000, batch=10, max_bytes=2 * MiB)
    hk = HISTORY_KINDS["tasks"]
    with ae.engine.connect() as conn:
        first, last = conn.execute(
            select(func.min(hk.settled), func.max(hk.settled)).where(
                hk.root.c.namespace_id == ns, hk.settled.is_not(None)
            )
        ).one()
    between = first + (last - first) * 3.5 / budget.SAMPLE_POINTS  # no sample point reads here
    _seed_big(ae, ns, q, roots=100, payload=50_000, at=between)  # ~2.5 MB of batches
    w = ae.worker("w", [vol], failpoints="volume.before_publish=sleep:0.02")
    job = create_job(ae, ns, "tasks")
    failed = wait_state(ae, job, DONE, timeout=120)
    assert failed.state is JobState.FAILED and failed.error_code == "BUDGET_EXCEEDED", failed
    assert 0 < failed.bytes <= 2 * MiB
    assert _beyond(vol, failed) == {}  # the file over budget was never written, nor any after
    assert len(file_snapshot(vol, failed)) == failed.batches + 1
    assert failed.attempts == failed.batches + 2  # the groups, and the claim that failed
    groups = [
        json.loads(line.split("archive.job.confirmed ", 1)[1].strip())["files"]
        for line in w.text().splitlines()
        if "archive.job.confirmed {" in line and job.id.hex() in line
    ]
    assert sum(groups) == failed.batches + 1 and max(groups) >= 2, groups
    partial = ae.orbit("job", "verify", "gbudget", job.id.hex(), "--volume", str(vol), "--json")
    assert json.loads(partial.stdout)["ok"] is True  # the confirmed prefix verifies
