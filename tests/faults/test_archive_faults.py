"""Fault tests of archive jobs with real `celery worker` processes (SPEC §5, §10).

Every test checks the invariants: a SUCCEEDED job verifies from disk and holds exactly the roots
of its range once; no confirmed file is ever deleted or rewritten.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, insert, select

from orbit_tasks.archive.claims import GROUP_FILES
from orbit_tasks.archive.engine import budget
from orbit_tasks.archive.engine.volume import job_dir, write_identity
from orbit_tasks.archive.format.names import parse_name, tail_name
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.dev import generator
from orbit_tasks.platform.history import HISTORY_KINDS
from orbit_tasks.queues import queue_name
from tests.support.archive_jobs import (
    REDIS_URL,
    ArchiveEnv,
    MiB,
    adoption_race,
    assert_succeeded_exactly,
    cli_json,
    create_job,
    file_snapshot,
    make_namespace,
    make_plan,
    make_volume,
    tick_wait,
    wait_for,
    wait_marker,
    wait_state,
)
from tests.support.fs import small_tmpfs
from tests.support.scene import archive_scene, run_claim

pytestmark = [pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

DONE = {JobState.SUCCEEDED, JobState.FAILED}


def _setup(ae: ArchiveEnv, name: str, roots: int = 30, batch: int = 5, **plan: Any) -> tuple:
    return archive_scene(
        ae.engine,
        name=name,
        volume=ae.tmp / f"vol-{name}",
        label=name,
        roots=roots,
        batch_size=batch,
        **plan,
    ).parts


def _confirmed(snapshot: dict[str, bytes], job: Job) -> dict[str, bytes]:
    """The files of ``snapshot`` that belong to the confirmed prefix of ``job``."""
    if not job.has_manifest:
        return {}
    names: dict[str, bytes] = {}
    seq, sha = job.batches, job.last_sha256
    while True:
        name = tail_name(seq, sha)
        names[name] = snapshot[name]
        if seq == 0:
            return names
        from orbit_tasks.archive.format.batch import decode_batch

        sha = decode_batch(snapshot[name]).header["prev_sha256"]
        seq -= 1


def _assert_kept(vol: Path, job: Job, confirmed: dict[str, bytes]) -> None:
    now = file_snapshot(vol, job)
    for name, data in confirmed.items():
        assert now.get(name) == data, f"confirmed file {name} was deleted or rewritten"


@pytest.mark.parametrize(
    "failpoint, stalled_claims",
    [
        ("archive.after_file_write=pause@3", 1),  # batch 2 written, not confirmed
        ("archive.after_confirm=pause@3", 1),  # batch 2 confirmed (next claim chained)
        ("archive.before_finalize=pause", 1),  # final batch confirmed, not finalized
    ],
)
def test_sigkill_at_a_step_boundary_then_takeover(
    ae: ArchiveEnv, failpoint: str, stalled_claims: int
) -> None:
    ns, _, vol, _ = _setup(ae, "kill")
    marker = ae.tmp / "marker"
    victim = ae.worker("victim", [vol], failpoints=f"{failpoint}:{marker}")
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)
    victim.signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    at_kill = ae.job(ns, job.id)
    assert at_kill.state is JobState.RUNNING  # the dead claim still holds its lease
    confirmed = _confirmed(file_snapshot(vol, job), at_kill)
    if "after_file_write" in failpoint:  # the group of batch 2, durable and unconfirmed
        assert 1 <= len(file_snapshot(vol, job)) - len(confirmed) <= GROUP_FILES
    ae.worker("rescuer", [vol])
    done = wait_state(ae, job, DONE, timeout=60)
    assert done.state is JobState.SUCCEEDED, done
    assert done.attempts == done.batches + 1 + stalled_claims
    _assert_kept(vol, job, confirmed)
    assert_succeeded_exactly(ae, done, vol)


def test_sigkill_while_read_ahead_batches_are_in_flight_then_takeover(ae: ArchiveEnv) -> None:
    """The worker is killed with batch 1 written but not confirmed and the read-ahead thread
    holding the batches after it (prepared, never written: the read-ahead writes nothing). The
    takeover removes the unconfirmed file and finishes; one claim died."""
    ns, _, vol, _ = _setup(ae, "readahead", roots=60)
    written, ahead = ae.tmp / "m-written", ae.tmp / "m-ahead"
    points = f"archive.after_file_write=pause@2:{written};archive.read_ahead=pause@3:{ahead}"
    victim = ae.worker("victim", [vol], failpoints=points)
    job = create_job(ae, ns, "tasks")
    wait_marker(written)  # the main thread: batch 1 durable, its confirm not sent
    wait_marker(ahead)  # the read-ahead thread: batches 2 and 3 prepared and handed over
    victim.signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    at_kill = ae.job(ns, job.id)
    assert at_kill.state is JobState.RUNNING and at_kill.batches == 0 and at_kill.has_manifest
    files = file_snapshot(vol, job)
    confirmed = _confirmed(files, at_kill)
    assert len(files) == len(confirmed) + 1  # batch 1 only: nothing was written ahead of it
    ae.worker("rescuer", [vol])
    done = wait_state(ae, job, DONE, timeout=60)
    assert done.state is JobState.SUCCEEDED, done
    assert done.attempts == done.batches + 2  # the killed claim confirmed nothing
    _assert_kept(vol, job, confirmed)
    assert_succeeded_exactly(ae, done, vol)


def test_duplicate_wakeup_has_one_owner(ae: ArchiveEnv) -> None:
    ns, _, vol, sid = _setup(ae, "dup", roots=40)
    w1 = ae.worker("one", [vol])
    w2 = ae.worker("two", [vol])  # both are ready (ae.worker waits) before the wake-ups
    job = create_job(ae, ns, "tasks")  # the tick publishes one wake-up ...
    ae.publish(sid, ns, job.id)  # ... and a duplicate goes out at once
    done = wait_state(ae, job, DONE, timeout=60, wake=False)
    assert done.state is JobState.SUCCEEDED
    assert done.attempts == done.batches + 1  # no extra claim
    hexid = job.id.hex()

    def has(w: Any, action: str) -> bool:
        return any(action in ln and hexid in ln for ln in w.text().splitlines())

    wait_for(lambda: has(w1, "archive.job.") and has(w2, "archive.job."), 20, "both deliveries")
    writers = [w for w in (w1, w2) if has(w, "archive.job.file_written")]
    assert len(writers) == 1, "exactly one worker wrote files"
    other = w2 if writers[0] is w1 else w1
    wait_for(lambda: has(other, "archive.job.not_claimed"), 20, "the duplicate was refused")
    assert not has(other, "archive.job.claimed")
    assert_succeeded_exactly(ae, done, vol)


def test_stale_worker_confirm_is_rejected(ae: ArchiveEnv) -> None:
    ns, _, vol, _ = _setup(ae, "stale")
    marker = ae.tmp / "stopped"
    # solo pool: the stopped process is the worker itself (no pool parent enforcing time limits)
    stale = ae.worker(
        "stale", [vol], failpoints=f"archive.after_file_write=stop@3:{marker}", pool="solo"
    )
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)
    wait_for(lambda: stale.proc.poll() is None and _is_stopped(stale.proc.pid), 10, "SIGSTOP")
    written = file_snapshot(vol, job)
    at_stop = ae.job(ns, job.id)
    stale_files = set(written) - set(_confirmed(written, at_stop))
    assert 1 <= len(stale_files) <= GROUP_FILES  # the group it wrote and did not confirm
    ae.worker("owner", [vol])
    # wait until the new owner confirmed past the stale worker's file
    past = tick_wait(
        ae, lambda: (j := ae.job(ns, job.id)).batches >= at_stop.batches + 2 and j, 60, "takeover"
    )
    confirmed = _confirmed(file_snapshot(vol, job), past)
    assert confirmed
    stale.signal(signal.SIGCONT)
    wait_for(lambda: "archive.job.lease_lost" in stale.text(), 30, "stale confirm rejected")
    done = wait_state(ae, job, DONE, timeout=60)
    assert done.state is JobState.SUCCEEDED, done
    _assert_kept(vol, job, confirmed)
    assert_succeeded_exactly(ae, done, vol)


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_redis_flush_only_delays_until_the_next_tick(ae: ArchiveEnv) -> None:
    ns, _, vol, sid = _setup(ae, "flush", roots=30)
    r = redis.Redis.from_url(REDIS_URL)
    queue = queue_name(sid)
    job = create_job(ae, ns, "tasks")  # wake-up published ...
    assert r.llen(queue) == 1  # ... it waits in the storage queue ...
    r.flushdb()  # ... and is lost
    w = ae.worker("w", [vol])
    # The lost wake-up, observed directly: the worker answers over the broker that it consumes
    # the storage queue, the queue is empty, and the job was never claimed.
    wait_for(lambda: queue in _consumed_queues(ae, w), 30, "the worker consuming its queue")
    assert r.llen(queue) == 0
    idle = ae.job(ns, job.id)
    assert idle.state is JobState.PENDING and idle.attempts == 0  # nobody was woken
    ae.worker("control", [])  # what beat does every ORBIT_TICK_SECONDS:
    ae.app.send_task("orbit.archive.tick", queue="orbit.control")  # the sweep publishes again
    done = wait_state(ae, job, DONE, timeout=60, wake=False)
    assert done.state is JobState.SUCCEEDED
    assert_succeeded_exactly(ae, done, vol)
    r.close()


def _consumed_queues(ae: ArchiveEnv, w: Any) -> set[str]:
    """Queues the worker says it consumes (a real remote-control call over the broker)."""
    hostname = f"{w.name}-{os.getpid()}@test"
    replies = ae.app.control.inspect(destination=[hostname], timeout=1.0).active_queues() or {}
    return {q["name"] for q in replies.get(hostname, [])}


def test_tampered_batch_is_chain_broken_and_verify_names_it(ae: ArchiveEnv) -> None:
    ns, _, vol, _ = _setup(ae, "tamper")
    marker = ae.tmp / "marker"
    # the second confirm: the manifest's, then the first group's (not final: 6 batches)
    victim = ae.worker("victim", [vol], failpoints=f"archive.after_confirm=pause@2:{marker}")
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)
    victim.signal(signal.SIGKILL)
    at_kill = ae.job(ns, job.id)
    assert 1 <= at_kill.batches <= GROUP_FILES
    d = job_dir(vol, ns, job.id)
    batch1 = next(p for p in d.iterdir() if (n := parse_name(p.name)) and n.seq == 1)
    data = bytearray(batch1.read_bytes())
    data[20] ^= 0xFF  # one flipped byte inside the gzip stream
    batch1.write_bytes(bytes(data))
    ae.worker("rescuer", [vol])
    done = wait_state(ae, job, DONE, timeout=60)
    assert done.state is JobState.FAILED and done.error_code == "CHAIN_BROKEN"
    assert done.lease_id is None
    proc = ae.orbit("job", "verify", "tamper", job.id.hex(), "--volume", str(vol), check=False)
    assert proc.returncode == 1
    assert batch1.name in proc.stdout
    assert batch1.exists()  # nothing confirmed is deleted, even when broken


def test_wrong_volume_is_storage_mismatch_and_writes_nothing(ae: ArchiveEnv) -> None:
    ns, _, vol, sid = _setup(ae, "wrongvol")
    other = make_volume(ae.engine, ae.tmp / "other-vol", "other")
    ae.worker("w", [vol])  # verified at start ...
    ident = vol / ".orbit-volume.json"
    ident.unlink()  # ... then another disk appears at the same mount point
    write_identity(vol, other, "other")
    job = create_job(ae, ns, "tasks")
    done = wait_state(ae, job, DONE, timeout=30)
    assert done.state is JobState.FAILED and done.error_code == "STORAGE_MISMATCH"
    assert done.batches == 0 and done.bytes == 0 and done.last_sha256 == ""
    assert not (vol / ns.hex()).exists()  # nothing written
    assert sid != other


def _seed_big(
    ae: ArchiveEnv, ns: bytes, q: bytes, roots: int, payload: int, at: Any = None
) -> None:
    """Task roots whose request_json carries ``payload`` random hex characters (gzip ~1/2);
    with ``at``, settled one millisecond apart from that time on."""
    rnd = random.Random(7)
    spec = generator.make_spec("tasks", roots, days=2, settled_fraction=1.0)
    hk = HISTORY_KINDS["tasks"]
    with ae.engine.begin() as conn:
        for chunk in generator.generate(spec, ns, [q], rnd, db_now(conn)):
            for i, root in enumerate(chunk.roots):
                root["request_json"] = f'{{"blob":"{rnd.randbytes(payload // 2).hex()}"}}'
                if at is not None:
                    root[hk.settled_column] = at + timedelta(milliseconds=i)
            conn.execute(insert(hk.root), chunk.roots)
            conn.execute(insert(hk.children[0].table), chunk.children)


def test_budget_exceeded_then_retry_with_a_higher_budget(ae: ArchiveEnv) -> None:
    """BUDGET_EXCEEDED stays the guard (SPEC §5) for rows fatter than the sample a range was cut
    with: 100 big roots settled between two of the sample's points, among small ones; the range
    is not cut (the sample saw small roots only) and its files outgrow the budget."""
    ns, q, vol, _ = _setup(ae, "budget", roots=2000, batch=10, max_bytes=2 * MiB)
    hk = HISTORY_KINDS["tasks"]
    with ae.engine.connect() as conn:
        first, last = conn.execute(
            select(func.min(hk.settled), func.max(hk.settled)).where(
                hk.root.c.namespace_id == ns, hk.settled.is_not(None)
            )
        ).one()
    between = first + (last - first) * 3.5 / budget.SAMPLE_POINTS  # no sample point reads here
    _seed_big(ae, ns, q, roots=100, payload=50_000, at=between)  # ~2.5 MB of batches
    ae.worker("w", [vol])
    job = create_job(ae, ns, "tasks")
    failed = wait_state(ae, job, DONE, timeout=60)
    assert failed.state is JobState.FAILED and failed.error_code == "BUDGET_EXCEEDED"
    assert 0 < failed.bytes <= 2 * MiB
    prefix = file_snapshot(ae.tmp / "vol-budget", failed)
    shown = cli_json(ae.orbit("job", "show", "budget", job.id.hex(), "--json"))
    assert shown["state"] == "FAILED" and shown["error_code"] == "BUDGET_EXCEEDED"
    assert shown["revision"] == failed.revision and shown["range"]["until"].endswith("Z")
    watch = ae.orbit("job", "watch", "budget", job.id.hex(), check=False)
    assert watch.returncode == 1 and "BUDGET_EXCEEDED" in watch.stdout
    partial = ae.orbit("job", "verify", "budget", job.id.hex(), "--volume", str(vol), "--json")
    assert cli_json(partial)["ok"] is True  # the confirmed prefix of a FAILED job verifies
    assert len(prefix) == failed.batches + 1  # the file over budget is not kept
    lower = ae.orbit("job", "retry", "budget", job.id.hex(), "--max-bytes", "1536KiB", check=False)
    assert lower.returncode == 2 and "lower than the job's max_bytes" in lower.stderr
    stale = ae.orbit(
        "job", "retry", "budget", job.id.hex(), "--max-bytes", "8MiB", "--expect-revision",
        str(failed.revision - 1), check=False,
    )  # fmt: skip
    assert stale.returncode == 3
    assert ae.job(ns, job.id) == failed  # refused: nothing written
    retried = cli_json(
        ae.orbit(
            "job", "retry", "budget", job.id.hex(), "--max-bytes", "8MiB", "--expect-revision",
            str(failed.revision), "--json",
        )
    )  # fmt: skip
    assert retried["state"] == "PENDING" and retried["max_bytes"] == 8 * MiB
    done = wait_state(ae, job, DONE, timeout=60)
    assert done.state is JobState.SUCCEEDED, done
    assert done.error_code == ""
    _assert_kept(vol, job, prefix)  # resumed from the confirmed prefix
    assert_succeeded_exactly(ae, done, vol)
    with ae.engine.connect() as conn:
        audit = conn.execute(
            select(audit_events.c.actor, audit_events.c.action).where(
                audit_events.c.namespace_id == ns, audit_events.c.target_id == job.id.hex()
            )
        ).all()
    assert [tuple(a) for a in audit] == [("test-operator", "archive.job.retry")]


def test_abandon_rules(ae: ArchiveEnv) -> None:
    ns, _, vol, sid = _setup(ae, "abandon")
    job = create_job(ae, ns, "tasks")  # PENDING, nobody mounts the volume
    live = ae.orbit("job", "retry", "abandon", job.id.hex(), check=False)
    assert live.returncode == 3  # retry only from FAILED
    out = cli_json(ae.orbit("job", "abandon", "abandon", job.id.hex(), "--json"))
    assert out["state"] == "ABANDONED"
    again = ae.orbit("job", "abandon", "abandon", job.id.hex(), check=False)
    assert again.returncode == 3
    missing = ae.orbit("job", "show", "abandon", "0" * 32, check=False)
    assert missing.returncode == 4
    with ae.engine.connect() as conn:
        from orbit_tasks.db.platform_tables import archive_plans

        active = conn.execute(
            select(archive_plans.c.active_job_id).where(archive_plans.c.namespace_id == ns)
        ).scalar()
    assert active is None  # the plan is free for the next run


@pytest.fixture
def tmpfs_volume(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "tmpfs", "768k") as mnt:
        yield mnt


def test_disk_full_on_a_small_tmpfs(ae: ArchiveEnv, tmpfs_volume: Path) -> None:
    ns, q = make_namespace(ae.engine, "diskfull")
    sid = make_volume(ae.engine, tmpfs_volume, "small")
    make_plan(ae.engine, ns, "tasks", sid, batch_size=10, max_bytes=64 * MiB)
    _seed_big(ae, ns, q, roots=100, payload=50_000)  # ~2.5 MB > 768 KiB
    ae.worker("w", [tmpfs_volume])
    job = create_job(ae, ns, "tasks")
    done = wait_state(ae, job, DONE, timeout=60)
    assert done.state is JobState.FAILED and done.error_code == "DISK_FULL"
    files = file_snapshot(tmpfs_volume, done)
    assert len(files) == done.batches + 1  # only the confirmed chain, no partial file
    assert not [n for n in os.listdir(job_dir(tmpfs_volume, ns, job.id)) if n.startswith(".tmp-")]


# --- the runner in-process (same code as the Celery task; real database and files) -------------


def _run(ae: ArchiveEnv, job: Job, vol: Path, sid: bytes, **overrides: Any) -> str:
    from orbit_tasks.archive.engine import runner

    settings = ae.settings.with_overrides(**overrides) if overrides else ae.settings
    return runner.run_job(
        job.namespace_id.hex(),
        job.id.hex(),
        {sid.hex(): vol},
        settings,
        engine=ae.engine,
        publish=lambda *_: None,
    )


def _seed_sized(
    ae: ArchiveEnv, ns: bytes, q: bytes, sizes: list[int], seed: int = 3, settled: Any = None
) -> list[bytes]:
    """One settled task root per entry, its request_json carrying that many random hex chars
    (settled at ``settled`` if given). Returns the root ids."""
    rnd = random.Random(seed)
    spec = generator.make_spec("tasks", len(sizes), days=2, settled_fraction=1.0)
    hk = HISTORY_KINDS["tasks"]
    with ae.engine.begin() as conn:
        chunk = next(generator.generate(spec, ns, [q], rnd, db_now(conn)))
        for root, size in zip(chunk.roots, sizes, strict=True):
            root["request_json"] = f'{{"blob":"{rnd.randbytes(size // 2).hex()}"}}'
            if settled is not None:
                root["finished_at"] = settled
        conn.execute(insert(hk.root), chunk.roots)
        conn.execute(insert(hk.children[0].table), chunk.children)
    return [r["id"] for r in chunk.roots]


def test_big_batch_is_halved_and_a_too_large_root_fails_until_the_budget_grows(
    ae: ArchiveEnv,
) -> None:
    ns, q = make_namespace(ae.engine, "sizes")
    vol = ae.tmp / "vol-sizes"
    sid = make_volume(ae.engine, vol)
    make_plan(ae.engine, ns, "tasks", sid, batch_size=10, max_bytes=2 * MiB)  # cap 512 KiB
    _seed_sized(ae, ns, q, [200_000] * 6)  # ~100 KB gzip each: 6 in one file would be ~600 KB
    job = create_job(ae, ns, "tasks")
    assert _run(ae, job, vol, sid) == "succeeded"
    done = ae.job(ns, job.id)
    assert done.roots == 6 and done.batches == 2  # halved once: 3 + 3
    assert all(len(d) <= 512 * 1024 for d in file_snapshot(vol, done).values())
    assert_succeeded_exactly(ae, done, vol)

    from orbit_tasks.archive.store import jobs as job_store
    from tests.support.archive_jobs import make_due

    with ae.engine.connect() as conn:
        until = job_store.job_range(conn, done).until  # = the next job's from (inclusive)
    big = _seed_sized(ae, ns, q, [1_200_000], seed=4, settled=until)  # ~600 KB gzip > cap
    make_due(ae.engine, ns, "tasks")
    job2 = create_job(ae, ns, "tasks")
    assert _run(ae, job2, vol, sid) == "failed"
    failed = ae.job(ns, job2.id)
    assert failed.error_code == "ROOT_TOO_LARGE" and failed.batches == 0  # manifest only
    ae.orbit("job", "retry", "sizes", job2.id.hex(), "--max-bytes", "4MiB")  # cap 1 MiB
    assert _run(ae, job2, vol, sid) == "succeeded"
    assert assert_succeeded_exactly(ae, ae.job(ns, job2.id), vol) == big


def test_stall_guard_fails_a_job_that_keeps_dying_and_retry_proceeds(ae: ArchiveEnv) -> None:

    ns, _, vol, sid = _setup(ae, "stall", roots=10)
    job = create_job(ae, ns, "tasks")
    for _ in range(2):  # two claims that die without confirming anything
        assert _dead_claim(ae, ns, job.id) is not None
    # takeover: attempts 3, batches 0 -> 3 - 0 - 1 = 2 stalls >= max_stalls 2
    assert _run(ae, job, vol, sid, archive_max_stalls=2) == "failed"
    stalled = ae.job(ns, job.id)
    assert stalled.error_code == "STALLED" and stalled.attempts == 3
    ae.orbit("job", "retry", "stall", job.id.hex(), "--expect-revision", str(stalled.revision))
    assert _run(ae, job, vol, sid, archive_max_stalls=2) == "succeeded"  # claim from PENDING
    assert_succeeded_exactly(ae, ae.job(ns, job.id), vol)


def test_source_changed_and_policy_missing(ae: ArchiveEnv) -> None:
    from orbit_tasks.db.history_tables import tasks
    from orbit_tasks.db.platform_tables import archive_policies

    ns, _, vol, sid = _setup(ae, "changed", roots=20)
    job = create_job(ae, ns, "tasks")
    assert _run(ae, job, vol, sid, archive_slice_seconds=0) == "released"  # manifest confirmed
    assert _run(ae, job, vol, sid, archive_slice_seconds=0) == "released"  # batch 1
    with ae.engine.begin() as conn:  # a settled root vanishes after it was counted
        last = conn.execute(
            select(tasks.c.id)
            .where(tasks.c.namespace_id == ns, tasks.c.finished_at.is_not(None))
            .order_by(tasks.c.finished_at.desc())
        ).first()
        assert last is not None
        conn.execute(tasks.update().where(tasks.c.id == last.id).values(finished_at=None))
    assert _run(ae, job, vol, sid) == "failed"
    assert ae.job(ns, job.id).error_code == "SOURCE_CHANGED"

    ns2, _, vol2, sid2 = _setup(ae, "nopolicy", roots=5)
    job2 = create_job(ae, ns2, "tasks")
    with ae.engine.begin() as conn:
        conn.execute(archive_policies.delete().where(archive_policies.c.namespace_id == ns2))
    assert _run(ae, job2, vol2, sid2) == "failed"
    assert ae.job(ns2, job2.id).error_code == "POLICY_MISSING"
    assert not job_dir(vol2, ns2, job2.id).exists()


def test_lock_wait_timeout_is_transient_not_a_failure(ae: ArchiveEnv) -> None:
    from orbit_tasks.db.engine import make_engine
    from orbit_tasks.db.platform_tables import archive_jobs

    ns, _, vol, sid = _setup(ae, "locked", roots=5)
    job = create_job(ae, ns, "tasks")
    impatient = make_engine(ae.url, connect_args={"init_command": "SET innodb_lock_wait_timeout=1"})
    try:
        with ae.engine.begin() as holder:  # another transaction holds the job row
            holder.execute(
                select(archive_jobs.c.id)
                .where(archive_jobs.c.namespace_id == ns, archive_jobs.c.id == job.id)
                .with_for_update()
            )
            from orbit_tasks.archive.engine import runner

            out = runner.run_job(
                ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings, engine=impatient
            )
        assert out == "transient"
        after = ae.job(ns, job.id)
        assert after.state is JobState.PENDING and after.attempts == 0 and after.error_code == ""
        assert runner.run_job(
            ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings, engine=impatient,
            publish=lambda *_: None,
        ) == "succeeded"  # fmt: skip
    finally:
        impatient.dispose()
    assert_succeeded_exactly(ae, ae.job(ns, job.id), vol)


def test_abandon_of_running_only_after_the_lease_expired(ae: ArchiveEnv) -> None:
    """Through the CLI (the database clock): a lease an hour from its end is live; a lease that
    ended an hour ago (a claim written with a clock in the past) has expired. The exact
    microsecond boundary is in test_job_store_contract.py."""
    from orbit_tasks.archive.store import jobs as job_store

    ns, _, _, _ = _setup(ae, "abrun", roots=3)
    job = create_job(ae, ns, "tasks")
    holder = job_store.claim(ae.engine, ns, job.id, lease_seconds=3600)
    assert holder is not None
    live = ae.orbit("job", "abandon", "abrun", job.id.hex(), check=False)
    assert live.returncode == 3 and "live lease" in live.stderr
    job_store.release(ae.engine, holder)
    assert _dead_claim(ae, ns, job.id) is not None
    out = cli_json(ae.orbit("job", "abandon", "abrun", job.id.hex(), "--json"))
    assert out["state"] == "ABANDONED" and out["lease_until"] is None


def _dead_claim(ae: ArchiveEnv, ns: bytes, job_id: bytes) -> Any:
    """A claim whose lease ended an hour ago by the database clock: the worker that took it is
    gone (what a 1 s lease and a sleep used to stand for, without depending on the load)."""
    from datetime import timedelta

    from orbit_tasks.archive.store import jobs as job_store
    from orbit_tasks.db.engine import FixedClock

    with ae.engine.connect() as conn:
        past = db_now(conn) - timedelta(hours=1)
        job = job_store.require_job(conn, ns, job_id)
    if job.lease_until is not None:  # right after the previous dead claim's lease
        past = max(past, job.lease_until + timedelta(microseconds=1))
    return job_store.claim(ae.engine, ns, job_id, lease_seconds=60, clock=FixedClock(past))


def test_database_connections_killed_mid_run(ae: ArchiveEnv) -> None:
    """The worker's MariaDB connections are killed over and over while it archives: transient
    faults stop the claim (the lease expires, a later claim continues) and never fail the job."""
    import threading

    from sqlalchemy import text

    ns, _, vol, _ = _setup(ae, "dbkill", roots=1500, batch=10)
    ae.worker("w", [vol])
    db = ae.engine.url.database
    stop = threading.Event()
    killed = [0]

    def killer() -> None:
        with ae.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            own = conn.execute(text("SELECT CONNECTION_ID()")).scalar()
            while not stop.is_set():
                ids = (
                    conn.execute(
                        text(
                            "SELECT id FROM information_schema.processlist"
                            " WHERE db = :db AND id <> :me"
                        ),
                        {"db": db, "me": own},
                    )
                    .scalars()
                    .all()
                )
                for cid in ids:
                    try:
                        conn.execute(text(f"KILL CONNECTION {int(cid)}"))
                        killed[0] += 1
                    except Exception:
                        pass  # already gone
                time.sleep(0.05)

    job = create_job(ae, ns, "tasks")
    wait_for(lambda: ae.job(ns, job.id).batches >= 3, 30, "progress")
    t = threading.Thread(target=killer, daemon=True)
    t.start()
    time.sleep(1.5)
    stop.set()
    t.join(timeout=10)
    assert killed[0] > 0
    done = wait_state(ae, job, DONE, timeout=90)
    assert done.state is JobState.SUCCEEDED, done
    assert done.error_code == ""
    assert_succeeded_exactly(ae, done, vol)


# --- review: stale claims and broken chains never delete confirmed files -----------------------


def test_stale_claim_resuming_after_a_takeover_deletes_no_confirmed_file(ae: ArchiveEnv) -> None:
    """A worker whose lease expired while it was paused (right after its claim) resumes after the
    new owner finished the job: it must notice the lost lease before removing "leftovers"."""
    ns, _, vol, sid = _setup(ae, "zombie", roots=10)
    job = create_job(ae, ns, "tasks")
    stale = _dead_claim(ae, ns, job.id)  # its lease expired while its worker was paused
    assert stale is not None
    assert _run(ae, job, vol, sid) == "succeeded"  # takeover by a live worker
    done = ae.job(ns, job.id)
    kept = file_snapshot(vol, done)
    assert len(kept) == done.batches + 1
    assert run_claim(stale, vol, ae.settings, engine=ae.engine) == "lease_lost"
    assert file_snapshot(vol, done) == kept
    assert_succeeded_exactly(ae, ae.job(ns, job.id), vol)


def test_finish_on_a_broken_chain_keeps_every_confirmed_file(ae: ArchiveEnv) -> None:
    """The final step re-verifies the chain; a corrupt middle batch is CHAIN_BROKEN, and the
    confirmed files before it are not taken for strays and deleted."""
    from orbit_tasks.db.history_tables import tasks

    ns, _, vol, sid = _setup(ae, "brokenfinish", roots=10, batch=5)
    job = create_job(ae, ns, "tasks")
    assert _run(ae, job, vol, sid, archive_slice_seconds=0) == "released"  # manifest
    assert _run(ae, job, vol, sid, archive_slice_seconds=0) == "released"  # batch 1
    with ae.engine.begin() as conn:  # the last settled root vanishes: batch 2 is short
        last = conn.execute(
            select(tasks.c.id, tasks.c.finished_at)
            .where(tasks.c.namespace_id == ns, tasks.c.finished_at.is_not(None))
            .order_by(tasks.c.finished_at.desc(), tasks.c.id.desc())
        ).first()
        assert last is not None
        conn.execute(tasks.update().where(tasks.c.id == last.id).values(finished_at=None))
    assert _run(ae, job, vol, sid) == "failed"
    failed = ae.job(ns, job.id)
    assert failed.error_code == "SOURCE_CHANGED" and failed.batches == 2
    confirmed = _confirmed(file_snapshot(vol, failed), failed)
    assert len(confirmed) == 3
    d = job_dir(vol, ns, job.id)
    batch1 = next(p for p in d.iterdir() if (n := parse_name(p.name)) and n.seq == 1)
    batch1.write_bytes(b"not gzip at all")  # bit rot in the middle of the chain
    with ae.engine.begin() as conn:
        conn.execute(
            tasks.update().where(tasks.c.id == last.id).values(finished_at=last.finished_at)
        )
    ae.orbit("job", "retry", "brokenfinish", job.id.hex())
    assert _run(ae, job, vol, sid) == "failed"  # claim from PENDING: tail ok and final -> finish
    assert ae.job(ns, job.id).error_code == "CHAIN_BROKEN"
    now = file_snapshot(vol, failed)
    for name in confirmed:
        assert name in now, f"confirmed file {name} was deleted"


def test_leftover_that_cannot_be_removed_is_io_error_not_a_raw_exception(ae: ArchiveEnv) -> None:
    """An OS error while removing leftovers (read-only remount, EIO, EACCES; here: a directory
    under a chain name) fails the job with IO_ERROR instead of escaping with its path."""
    ns, _, vol, sid = _setup(ae, "unremovable", roots=10)
    job = create_job(ae, ns, "tasks")
    assert _run(ae, job, vol, sid, archive_slice_seconds=0) == "released"  # manifest confirmed
    (job_dir(vol, ns, job.id) / f"00000007-{'ab' * 32}.jsonl.gz").mkdir()
    assert _run(ae, job, vol, sid) == "failed"
    failed = ae.job(ns, job.id)
    assert failed.error_code == "IO_ERROR" and failed.lease_id is None


def test_stale_writer_does_not_remove_a_file_the_new_owner_adopted(ae: ArchiveEnv) -> None:
    """SPEC §5 step 6 race: the stale claim writes file N after the new owner's cleanup; the owner
    then finds N already there with identical bytes and confirms it. The stale writer's removal
    (its confirm was rejected) must not delete the file the owner is confirming."""
    from orbit_tasks.archive.engine import leftovers
    from orbit_tasks.archive.engine.volume import store_job_file
    from orbit_tasks.archive.format import names as file_names
    from orbit_tasks.archive.format import values as fv
    from orbit_tasks.archive.store import jobs as job_store
    from orbit_tasks.errors import LeaseLost

    ns, _, vol, sid = _setup(ae, "adopted", roots=5)
    job = create_job(ae, ns, "tasks")
    stale = _dead_claim(ae, ns, job.id)
    assert stale is not None
    owner = job_store.claim(ae.engine, ns, job.id, lease_seconds=60)  # takeover
    assert owner is not None and owner.takeover
    from types import SimpleNamespace

    with ae.engine.connect() as conn:
        with conn.begin():
            rng = job_store.job_range(conn, owner.job)
        data, _ = budget.manifest_file(conn, owner.job, rng)
    written = SimpleNamespace(name=file_names.manifest_name(fv.sha256_hex(data)), data=data)
    assert written is not None  # the manifest: identical bytes for both claims
    d = job_dir(vol, ns, job.id)
    mine = store_job_file(d, written.name, written.data)  # the stale claim's late write
    assert mine.created
    theirs = store_job_file(d, written.name, written.data)  # the owner finds it there
    assert not theirs.created
    with pytest.raises(LeaseLost):
        job_store.confirm(
            ae.engine, stale, is_batch=False, roots=0, size=len(written.data),
            sha256=fv.sha256_hex(written.data), after="keep", lease_seconds=60,
        )  # fmt: skip
    with ae.engine.connect() as conn:
        leftovers.remove_unless_confirmed(conn, stale, d, written.name, mine)
    job_store.confirm(
        ae.engine, owner, is_batch=False, roots=0, size=len(written.data),
        sha256=fv.sha256_hex(written.data), after="release", lease_seconds=60,
    )  # fmt: skip
    assert (d / written.name).read_bytes() == written.data  # the confirmed manifest is there
    assert _run(ae, job, vol, sid) == "succeeded"
    assert_succeeded_exactly(ae, ae.job(ns, job.id), vol)


def test_stale_writer_ahead_of_a_pending_job_does_not_remove_a_file_a_new_claim_adopted(
    ae: ArchiveEnv,
) -> None:
    """The same race as above with the job PENDING when the stale writer reads the row: a claim
    taking the job right after that read adopts the stale inode (``link`` refuses the name,
    identical bytes); the inode-fenced removal then deletes the file that claim confirms
    (``adoption_race`` in tests/support/archive_jobs.py)."""
    from orbit_tasks.archive.engine.storage import FolderStorage

    ns, _, vol, sid = _setup(ae, "adoptpending", roots=10)
    job = create_job(ae, ns, "tasks")
    outcome, removed = adoption_race(ae, job, FolderStorage(vol), vol)
    done = ae.job(ns, job.id)
    assert outcome == "succeeded" and done.state is JobState.SUCCEEDED, (outcome, done)
    assert removed == 0
    assert_succeeded_exactly(ae, done, vol)


def test_finish_refuses_a_manifest_whose_range_no_longer_matches_the_database(
    ae: ArchiveEnv,
) -> None:
    """Step 5 checks the manifest's range against the range any node derives from the database
    (as `orbit job verify` does): a job never becomes SUCCEEDED with files a later verify
    rejects. Here an earlier SUCCEEDED job appears after the manifest was written."""
    from datetime import timedelta

    from orbit_tasks.db.platform_tables import archive_jobs
    from orbit_tasks.ids import new_id

    ns, _, vol, sid = _setup(ae, "rangemoved", roots=10, batch=5)
    job = create_job(ae, ns, "tasks")
    assert _run(ae, job, vol, sid, archive_slice_seconds=0) == "released"  # manifest confirmed
    before = file_snapshot(vol, ae.job(ns, job.id))
    with ae.engine.begin() as conn:
        conn.execute(
            insert(archive_jobs).values(
                namespace_id=ns, id=new_id(), kind="tasks", plan_revision=1,
                policy_revision=job.policy_revision, storage_id=sid, batch_size=5,
                max_bytes=job.max_bytes, state="SUCCEEDED",
                created_at=job.created_at - timedelta(hours=30),
                updated_at=job.created_at - timedelta(hours=30),
            )
        )  # fmt: skip
    assert _run(ae, job, vol, sid) == "failed"
    failed = ae.job(ns, job.id)
    assert failed.error_code == "CHAIN_BROKEN" and failed.state == "FAILED"
    after = file_snapshot(vol, failed)
    for name, data in before.items():
        assert after.get(name) == data, f"confirmed file {name} was deleted or rewritten"
