"""The read-ahead in a process of its own (issue 19, docs/archive-jobs.md "The reader process").

The process prepares exactly the files the threads prepare; a reader process killed mid-job is
a transient fault (the claim stops, its lease expires, a takeover finishes the job), never a job
failure; and a worker killed mid-job leaves no reader process behind.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from orbit_tasks.archive.claims import file_cap
from orbit_tasks.archive.engine import reader_process, runner
from orbit_tasks.archive.engine.readahead import PreparedBatch, ReadAhead
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.db.engine import db_now
from orbit_tasks.errors import ReaderLost, TransientError
from tests.support.archive_jobs import (
    ArchiveEnv,
    assert_succeeded_exactly,
    create_job,
    tick_wait,
    wait_for,
    wait_marker,
    wait_state,
)
from tests.support.scene import archive_scene, deliver, deliver_in_thread

pytestmark = [pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

DONE = {JobState.SUCCEEDED, JobState.FAILED}


def _setup(ae: ArchiveEnv, name: str, kind: str, roots: int, batch: int) -> tuple:
    ns, q, vol, sid = archive_scene(
        ae.engine,
        name=name,
        volume=ae.tmp / f"vol-{name}",
        kind=kind,
        roots=roots,
        batch_size=batch,
        label=name,
    ).parts
    return ns, vol, sid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead too
        return fh.read().split(") ", 1)[1][0] != "Z"


@pytest.mark.parametrize("kind", ["tasks", "events"])
def test_the_process_prepares_exactly_the_files_the_threads_prepare(
    ae: ArchiveEnv, kind: str
) -> None:
    ns, _, _ = _setup(ae, f"same-{kind}", kind, roots=300, batch=7)
    job = create_job(ae, ns, kind)
    with ae.engine.connect() as conn:
        rng = job_store.job_range(conn, job)
    job = replace(job, last_sha256="ab" * 32)  # as after its manifest

    def prepared(ahead: ReadAhead | reader_process.ProcessReadAhead) -> list[PreparedBatch]:
        out: list[PreparedBatch] = []
        with ahead:
            while (batch := ahead.next()) is not None:
                out.append(batch)
                if batch.final:
                    break
        return out

    cap = file_cap(job.max_bytes)
    threads = prepared(ReadAhead(ae.engine, job, rng, None, cap))
    process = prepared(reader_process.ProcessReadAhead(ae.engine, job, rng, None, cap))
    assert len(threads) > 10 and threads[-1].final
    assert process == threads


def test_a_chain_stopped_early_kills_its_reader_and_the_next_uses_a_warm_spare(
    ae: ArchiveEnv,
) -> None:
    ns, _, _ = _setup(ae, "early", "tasks", roots=300, batch=5)
    job = create_job(ae, ns, "tasks")
    with ae.engine.connect() as conn:
        rng = job_store.job_range(conn, job)
    job = replace(job, last_sha256="ab" * 32)  # as after its manifest
    cap = file_cap(job.max_bytes)
    ahead = reader_process.ProcessReadAhead(ae.engine, job, rng, None, cap)
    with ahead:
        first = ahead.next()
        proc = ahead._proc
        assert first is not None and proc is not None and proc.poll() is None
        assert reader_process._spare is None  # no interpreter starts beside a running chain
    assert proc.poll() is not None  # killed: it held prepared files nobody will use
    spare = reader_process._spare
    assert spare is not None and spare.poll() is None  # the next chain's, started at the end
    with reader_process.ProcessReadAhead(ae.engine, job, rng, None, cap) as again:
        assert again._proc is spare
        assert again.next() == first


def test_a_chain_read_to_its_end_hands_its_reader_to_the_next_chain(ae: ArchiveEnv) -> None:
    """A catch-up runs one short chain per job (issue 25): a chain that took its final batch
    gives its process back as the spare, and the next chain's request is served by that
    same process (no interpreter started per chain), with the same files as a fresh one."""
    ns, _, _ = _setup(ae, "reuse", "tasks", roots=60, batch=5)
    job = create_job(ae, ns, "tasks")
    with ae.engine.connect() as conn:
        rng = job_store.job_range(conn, job)
    job = replace(job, last_sha256="ab" * 32)  # as after its manifest
    cap = file_cap(job.max_bytes)

    def whole(ahead: reader_process.ProcessReadAhead) -> tuple[Any, list[PreparedBatch]]:
        with ahead:
            out = []
            while (batch := ahead.next()) is not None:
                out.append(batch)
            return ahead._proc, out

    proc, first = whole(reader_process.ProcessReadAhead(ae.engine, job, rng, None, cap))
    assert first and first[-1].final
    assert proc is not None and proc.poll() is None and reader_process._spare is proc
    again, second = whole(reader_process.ProcessReadAhead(ae.engine, job, rng, None, cap))
    assert again is proc and second == first
    with reader_process.ProcessReadAhead(ae.engine, job, rng, None, cap) as runner_like:
        while not runner_like.next().final:  # type: ignore[union-attr]
            pass  # as the runner: it stops at the final batch and never asks for the end
    assert runner_like._proc is proc and reader_process._spare is proc and proc.poll() is None
    reader_process.discard_spare()
    assert proc.poll() is not None


def test_a_killed_reader_process_is_transient_and_a_takeover_finishes(
    ae: ArchiveEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the runner's own process: the reader is SIGKILLed after handing over its second file;
    the claim stops with ``transient`` (not a failure), the job keeps its lease until it
    expires, and the next delivery takes it over and finishes it."""
    ns, vol, sid = _setup(ae, "killed", "tasks", roots=200, batch=5)
    marker = ae.tmp / "reader-paused"
    monkeypatch.setenv("ORBIT_FAILPOINTS", f"archive.read_ahead=pause@2:{marker}")
    reader_process.discard_spare()  # the next spare starts with that environment
    job = create_job(ae, ns, "tasks")
    settings = ae.settings.with_overrides(archive_reader="process")
    delivery = deliver_in_thread(job, {sid.hex(): vol}, settings, engine=ae.engine)
    reader_pid = wait_marker(marker)
    os.kill(reader_pid, signal.SIGKILL)
    outcome = delivery.join(60)
    assert outcome == [runner.Outcome.TRANSIENT]
    stopped = ae.job(ns, job.id)
    assert stopped.state is JobState.RUNNING and not stopped.error_code
    monkeypatch.delenv("ORBIT_FAILPOINTS")
    reader_process.discard_spare()
    assert stopped.lease_until is not None
    time.sleep(max(0.0, (stopped.lease_until - _db_now(ae)).total_seconds()) + 0.2)
    again = deliver(job, {sid.hex(): vol}, settings, engine=ae.engine)
    assert again == runner.Outcome.SUCCEEDED
    done = ae.job(ns, job.id)
    assert done.attempts == done.batches + 2  # the claim whose reader died, then one takeover
    assert_succeeded_exactly(ae, done, vol)


def _db_now(ae: ArchiveEnv) -> datetime:
    with ae.engine.connect() as conn:
        return db_now(conn)


def test_a_worker_killed_mid_job_leaves_no_reader_and_a_killed_reader_never_fails_the_job(
    ae: ArchiveEnv,
) -> None:
    """Real workers: (1) the reader of a worker's claim is SIGKILLed -- the worker logs a
    transient fault and the job is taken over after its lease and verifies; (2) a worker killed
    while its reader is paused takes the reader with it."""
    ns, vol, _ = _setup(ae, "workers", "tasks", roots=200, batch=5)
    marker = ae.tmp / "reader-paused"
    w = ae.worker("victim", [vol], failpoints=f"archive.read_ahead=pause@2:{marker}")
    job = create_job(ae, ns, "tasks")
    reader_pid = wait_marker(marker)
    assert _alive(reader_pid) and reader_pid != w.proc.pid
    os.kill(reader_pid, signal.SIGKILL)
    wait_for(lambda: "archive.job.transient" in w.text(), 30, "a transient stop")
    assert "ReaderLost" in w.text()
    # every later reader of this worker pauses too (the failpoint is in its environment): the
    # worker holds the next claim with its reader paused; kill the worker itself
    marker.unlink()
    tick_wait(ae, marker.exists, 60, "the takeover's reader paused")  # after the lease expired
    second = wait_marker(marker)
    w.signal(signal.SIGKILL)
    w.proc.wait(timeout=10)
    wait_for(lambda: not _alive(second), 10, "the reader dies with its worker")
    ae.worker("rescuer", [vol])
    done = wait_state(ae, job, DONE, timeout=90)
    assert done.state is JobState.SUCCEEDED and not done.error_code, done
    assert_succeeded_exactly(ae, done, vol)


def test_reader_lost_is_a_transient_error() -> None:
    assert issubclass(ReaderLost, TransientError)
