"""A dead pool child is taken over in seconds (issue 25 item 5; docs/archive-jobs.md "A dead pool
child").

Real MariaDB, real Redis, a real ``orbit worker archive`` whose pool child is SIGKILLed
mid-job while its main process lives on. The store's fence (``expire_lost_lease``) on its
own is tested on MariaDB and SQLite in tests/contract/test_job_store_contract.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from orbit_tasks.archive.engine import claim_marks
from orbit_tasks.archive.jobs import Job, JobState
from tests.support.archive_jobs import (
    ArchiveEnv,
    assert_succeeded_exactly,
    create_job,
    wait_for,
    wait_state,
)
from tests.support.scene import archive_scene

LEASE = 120  # the default lease: waiting it out would take over two minutes
TAKEOVER_WITHIN = 20.0  # seconds from the child's death to the next claim (shared CPU: generous)


@pytest.fixture
def archive_overrides() -> dict[str, str]:
    return {
        "ORBIT_ARCHIVE_LEASE_SECONDS": str(LEASE),
        "ORBIT_ARCHIVE_SLICE_SECONDS": "60",  # one claim chain holds the job for the whole test
    }


def _held_mark(ae: ArchiveEnv, job: Job) -> claim_marks.Mark | None:
    """The mark of a pool child holding ``job`` now (any worker main process of this test)."""
    root = ae.settings.var_dir / claim_marks.MARKS_DIR
    for path in root.glob("*/*"):
        mark = claim_marks.read_mark(path)
        if mark is not None and mark.job_id == job.id:
            return mark
    return None


@pytest.mark.mariadb
def test_a_sigkilled_pool_child_is_taken_over_in_seconds_and_the_job_verifies(
    ae: ArchiveEnv,
) -> None:
    ns, q, vol, sid = archive_scene(
        ae.engine,
        name="childkill",
        volume=ae.tmp / "vol",
        roots=60,
        batch_size=5,
        label="childkill",
    ).parts
    # every confirm takes a while: the test kills the child in the middle of its chain
    w = ae.worker("w", [vol], failpoints="archive.after_confirm=sleep:0.4")
    job = create_job(ae, ns, "tasks")

    def holding() -> tuple[claim_marks.Mark, Job] | None:
        mark, now = _held_mark(ae, job), ae.job(ns, job.id)
        if mark is None or now.batches < 2 or now.lease_id != mark.lease_id:
            return None
        return mark, now

    mark, _ = wait_for(holding, 60, "a pool child holding the job after two batches")
    assert mark.pid != w.proc.pid  # a pool child, not the worker's main process
    os.kill(mark.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    at_kill = ae.job(ns, job.id)
    # the dead child held the job (a dead process writes nothing more: nobody else can have
    # taken it, the lease runs two minutes)
    assert at_kill.state is JobState.RUNNING and at_kill.lease_id == mark.lease_id

    def taken_over() -> Job | None:
        now = ae.job(ns, job.id)
        return now if now.attempts > at_kill.attempts else None

    # no tick runs here: only the main process's own wake-up can bring the takeover
    after = wait_for(taken_over, TAKEOVER_WITHIN, "a takeover after the child's death")
    took = time.monotonic() - killed_at
    assert after.lease_id != mark.lease_id
    assert w.proc.poll() is None  # the main process lived on
    done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90, wake=False)
    assert done.state is JobState.SUCCEEDED, done
    assert_succeeded_exactly(ae, done, vol)
    # the claim is in the database before its log line: read the log once the job is done
    wait_for(lambda: "archive.job.takeover" in w.text(), 10, "the takeover's log line")
    assert "archive.job.child_lost" in w.text()
    assert _held_mark(ae, job) is None  # the dead child's mark is gone, the live one emptied
    # stall accounting: the takeover is one more attempt, counted like a lease that ran out
    assert done.attempts >= at_kill.attempts + 1
    print(f"takeover {took:.2f} s after the SIGKILL (lease {LEASE} s)")


def test_marks_name_only_exited_children_of_the_job(tmp_path: Path) -> None:
    folder = tmp_path / "marks"
    folder.mkdir()
    ns, job, lease = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16
    line = f"{ns.hex()} {job.hex()} {lease.hex()}\n"
    (folder / str(os.getpid())).write_text(line)  # alive: this very process
    (folder / "999999999").write_text(line)  # no such process
    (folder / "999999998").write_text(line[:40])  # a partial write
    (folder / "999999997").write_text(line.replace(job.hex(), "ff" * 16))  # another job
    (folder / "notapid").write_text(line)
    lost = claim_marks.lost_marks(folder, ns, job, wait=0.1)
    assert [(m.pid, m.lease_id) for m in lost] == [(999999999, lease)]
