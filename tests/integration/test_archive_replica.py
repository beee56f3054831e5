"""Reading archive history from a replica (issue 16 item 4, ``ORBIT_ARCHIVE_SOURCE_URL``).

A private primary and a private replica ``mariadbd`` (tests/support/replica.py), real
``orbit worker archive`` processes, real volume directories. The job tables live on the primary
only in the sense that every write goes there; the replica receives them through replication
like everything else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text, update

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.engine.volume import write_identity
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import source
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.archive.wakeups import make_publisher
from orbit_tasks.db.engine import FixedClock, db_now, make_engine
from orbit_tasks.db.migrate import upgrade
from orbit_tasks.db.platform_tables import archive_jobs, heartbeat, metadata
from orbit_tasks.queues import queue_name
from tests.support.archive_jobs import (
    LEASE,
    ArchiveEnv,
    archive_env,
    assert_succeeded_exactly,
    cli_json,
    create_job,
    file_snapshot,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_for,
    wait_state,
)
from tests.support.cli import assert_one_line_error, orbit_env, run_orbit
from tests.support.mariadb_server import free_port
from tests.support.metrics import running_exporter, value
from tests.support.replica import ReplicaPair, replica_pair
from tests.support.scene import archive_scene

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicaPair]:
    if os.geteuid() != 0:
        pytest.fail("the replica tests start mariadbd --user=root and need root")
    with replica_pair() as p:
        yield p


@pytest.fixture
def dbs(pair: ReplicaPair) -> Iterator[tuple[str, str, Engine, Engine]]:
    """A migrated platform database on the primary, replicated: (primary URL, replica URL,
    primary engine, replica engine)."""
    with pair.database() as (primary_url, replica_url):
        primary = make_engine(primary_url)
        replica = make_engine(replica_url)
        try:
            upgrade(primary, "platform")
            pair.wait_caught_up()
            yield primary_url, replica_url, primary, replica
        finally:
            primary.dispose()
            replica.dispose()


def _checksums(engine: Engine) -> dict[str, object]:
    with engine.connect() as conn:
        names = conn.execute(
            text("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()")
        ).scalars()
        return {n: conn.execute(text(f"CHECKSUM TABLE `{n}` EXTENDED")).one()[1] for n in names}


def _rerun_from_primary(ae: ArchiveEnv, primary: Engine, done: Job, vol: Path) -> dict[str, bytes]:
    """The same job (same row, range, created_at) run again from the start, reading the primary,
    into another directory of the same storage: its files."""
    write_identity(vol, done.storage_id, "again")
    with primary.begin() as conn:
        conn.execute(
            update(archive_jobs)
            .where(archive_jobs.c.namespace_id == done.namespace_id, archive_jobs.c.id == done.id)
            .values(
                state="PENDING",
                batches=0,
                roots=0,
                bytes=0,
                last_sha256="",
                error_code="",
                lease_id=None,
                lease_until=None,
                attempts=0,
            )  # fmt: skip
        )
    assert _deliver(ae, done, vol, primary, primary) == "succeeded"
    return file_snapshot(vol, done)


def _deliver(ae: ArchiveEnv, job: Job, vol: Path, primary: Engine, source_db: Engine) -> str:
    """One delivery of ``job`` in this process (plans, leases, confirms on ``primary``, history
    read on ``source_db``), until one does not end with its time slice (``released``)."""
    while True:
        out = runner.run_job(
            job.namespace_id.hex(), job.id.hex(), {job.storage_id.hex(): vol}, ae.settings,
            engine=primary, source_engine=source_db, publish=lambda *a, **k: None,
        )  # fmt: skip
        if out != "released":
            return out


def _replicated_job(
    ae: ArchiveEnv, pair: ReplicaPair, name: str, kind: str, roots: int, batch_size: int
) -> tuple[bytes, bytes, Path, Job]:
    """A namespace ``name`` with ``roots`` of ``kind``, a volume, a plan and the job a tick
    created, everything replicated: (namespace, queue, volume, job)."""
    ns, q, vol, sid = archive_scene(
        ae.engine, name=name, volume=ae.tmp / "vol", kind=kind, roots=roots, batch_size=batch_size
    ).parts
    job = create_job(ae, ns, kind)
    pair.wait_caught_up()
    return ns, q, vol, job


@pytest.mark.slow
def test_a_job_waits_replica_lag_while_the_sql_thread_is_stopped_then_finishes(
    pair: ReplicaPair, dbs: tuple[str, str, Engine, Engine], tmp_path: Path
) -> None:
    """A real worker reading the replica: with the replica's SQL thread stopped, a job created
    after that waits `replica_lag` (no claim, no error code, attempts flat, longer than three
    leases of the database clock, moved on); started again, the job finishes, `orbit job verify`
    passes, and its files equal those of the same job read from the primary."""
    primary_url, replica_url, primary, _replica = dbs
    with archive_env(
        primary_url, primary, tmp_path, ORBIT_ARCHIVE_SOURCE_URL=replica_url
    ) as ae:  # fmt: skip
        ns, q, vol, sid = archive_scene(
            primary, name="lag", volume=tmp_path / "vol", kind="workflows", roots=150, batch_size=9
        ).parts
        pair.wait_caught_up()
        w = ae.worker("replica", [vol])
        pair.stop_sql_thread()
        status = pair.status()
        # what a lag check on Seconds_Behind_Master would have seen: nothing to wait for
        assert status["Slave_SQL_Running"] == "No" and status["Seconds_Behind_Master"] is None
        job = create_job(ae, ns, "workflows")  # the tick beats on the primary, not applied
        wait_for(lambda: _show(ae, job)["waiting"] == "replica_lag", 30, "replica_lag wait")
        with primary.connect() as conn:
            waiting_from = db_now(conn)  # the wait began before this
        # Longer than three leases without waiting for them: ticks on the database clock moved
        # on one lease at a time (the sweep decides as it would then and wakes the job up; each
        # wake-up finds the replica behind, which no clock changes).
        for k in range(5):  # 0 to 4 leases on
            held = ae.job(ns, job.id)
            assert held.state is JobState.PENDING, held
            assert (held.attempts, held.batches, held.error_code) == (0, 0, ""), held
            clock = FixedClock(waiting_from + timedelta(seconds=k * LEASE))
            run_tick(primary, ae.settings, publish=make_publisher(ae.app), clock=clock)
            time.sleep(0.5)
        held = ae.job(ns, job.id)
        assert (held.state, held.attempts, held.batches, held.error_code) == (
            JobState.PENDING, 0, 0, "",
        ), held  # fmt: skip
        assert "archive.job.waiting" in w.text() and "archive.job.claimed" not in w.text()
        with primary.connect() as conn:
            held_for = (db_now(conn) - waiting_from).total_seconds()
        pair.start_sql_thread()
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
        assert done.state is JobState.SUCCEEDED and done.error_code == "", done
        shown = _show(ae, done)
        assert shown["waiting"] is None and shown["waited_seconds"]["replica_lag"] >= held_for > 0
        verify = ae.orbit("job", "verify", "lag", job.id.hex(), "--volume", str(vol))
        assert verify.stdout.startswith("ok: "), verify.stdout
        assert_succeeded_exactly(ae, done, vol)
        from_replica = file_snapshot(vol, done)
        w.stop()
        from_primary = _rerun_from_primary(ae, primary, done, tmp_path / "vol-primary")
        assert from_replica == from_primary and len(from_replica) == done.batches + 1


def _show(ae: ArchiveEnv, job: Job) -> dict[str, Any]:
    """The job's statistics (`orbit job show --json`): what it waits for, seconds waited."""
    doc = cli_json(ae.orbit("job", "show", job.namespace_id.hex(), job.id.hex(), "--json"))
    return dict(doc["statistics"])


def test_tick_beats_after_its_jobs(
    pair: ReplicaPair, dbs: tuple[str, str, Engine, Engine], tmp_path: Path
) -> None:
    """The heartbeat the tick writes on the primary is at or after the creation of every job it
    created, and reaches the replica."""
    primary_url, _replica_url, primary, replica = dbs
    with archive_env(primary_url, primary, tmp_path) as ae:
        ns, q = make_namespace(primary, "beat")
        sid = make_volume(primary, tmp_path / "vol")
        make_plan(primary, ns, "events", sid)
        job = create_job(ae, ns, "events")
        with primary.connect() as conn:
            beat = conn.execute(text("SELECT beat_at FROM orbit_archive_heartbeat")).scalar_one()
            assert conn.execute(text("SELECT COUNT(*) FROM orbit_archive_heartbeat")).scalar() == 1
        assert beat >= job.created_at
        pair.wait_caught_up()
        with replica.connect() as conn:
            assert source.replica_beat(conn) == beat
        pair.stop_sql_thread()
        ae.tick()
        with replica.connect() as conn:
            assert source.replica_beat(conn) == beat  # not applied: the replica shows the old one
        pair.start_sql_thread()
        with primary.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM orbit_archive_heartbeat")).scalar() == 1
            assert conn.execute(text("SELECT beat_at FROM orbit_archive_heartbeat")).scalar() > beat


def test_files_read_from_the_replica_equal_those_read_from_the_primary(
    pair: ReplicaPair, dbs: tuple[str, str, Engine, Engine], tmp_path: Path
) -> None:
    primary_url, replica_url, primary, replica = dbs
    with archive_env(primary_url, primary, tmp_path) as ae:
        ns, q, vol, job = _replicated_job(ae, pair, "same-bytes", "tasks", 120, 7)
        assert _deliver(ae, job, vol, primary, replica) == "succeeded"
        done = ae.job(ns, job.id)
        assert_succeeded_exactly(ae, done, vol)
        from_replica = file_snapshot(vol, done)
        from_primary = _rerun_from_primary(ae, primary, done, tmp_path / "vol-primary")
        assert from_replica == from_primary and len(from_replica) == done.batches + 1


def test_the_count_is_the_primarys_and_the_batches_are_read_on_the_replica(
    pair: ReplicaPair, dbs: tuple[str, str, Engine, Engine], tmp_path: Path
) -> None:
    """Issue 24 item 2: with a root deleted on the replica alone, `plan preview` (which counts
    there) shows one root less, but the job's manifest promises the primary's count; the batch
    read there differs and the job waits. Repaired, it SUCCEEDS with the primary's roots."""
    primary_url, replica_url, primary, replica = dbs
    with archive_env(primary_url, primary, tmp_path) as ae:
        ns, q, vol, job = _replicated_job(ae, pair, "reads-there", "events", 40, 5)
        with primary.connect() as conn:
            rng = job_store.job_range(conn, job)
            keys = source.root_keys_in_range(conn, "events", ns, rng)
        database = primary.url.database
        assert database is not None
        pair.replica_local(database, f"DELETE FROM orbit_events WHERE id = x'{keys[0].hex()}'")
        env = {**ae.env, "ORBIT_ARCHIVE_SOURCE_URL": replica_url}
        doc = cli_json(run_orbit(["plan", "preview", "reads-there", "events", "--json"], env))
        assert doc["source"] == "replica" and doc["replica_beat_at"] is not None
        assert doc["roots"] == len(keys) - 1  # counted there

        def run() -> str:
            return _deliver(ae, job, vol, primary, replica)

        assert run() == "stopped"
        (manifest,) = file_snapshot(vol, ae.job(ns, job.id)).values()
        assert json.loads(manifest)["roots_total"] == len(keys)
        _restore_rows(primary, replica, "orbit_events", ns, [keys[0]])
        assert run() == "succeeded"
        done = ae.job(ns, job.id)
        assert done.roots == len(keys)
        assert_succeeded_exactly(ae, done, vol)


def _restore_rows(
    primary: Engine, replica: Engine, table: str, ns: bytes, ids: list[bytes]
) -> None:
    """Repair the replica by hand (``sql_log_bin = 0``): the primary's rows of ``ids`` in
    ``table`` (a root table) replace whatever the replica has."""
    t = metadata.tables[table]
    with primary.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(t.select().where(t.c.id.in_(ids)))]
    with replica.begin() as conn:
        conn.execute(text("SET SESSION sql_log_bin = 0"))
        conn.execute(t.delete().where(t.c.namespace_id == ns, t.c.id.in_(ids)))
        if rows:
            conn.execute(t.insert(), rows)


ERRANT = {
    # a root deleted, a child changed, a root inserted: each within the job's range
    "delete": lambda key: [f"DELETE FROM orbit_tasks WHERE id = x'{key.hex()}'"],
    "update": lambda key: [
        f"UPDATE orbit_task_attempts SET worker = 'elsewhere' WHERE task_id = x'{key.hex()}'"
    ],
    "insert": lambda key: [
        "INSERT INTO orbit_tasks (namespace_id, id, queue_id, state, request_json, "
        "error_code, attempts, created_at, started_at, finished_at) "
        f"SELECT namespace_id, x'{'ee' * 16}', queue_id, state, request_json, error_code, "
        f"attempts, created_at, started_at, finished_at FROM orbit_tasks WHERE id = x'{key.hex()}'"
    ],
}


def _repair(pair: ReplicaPair, primary: Engine, replica: Engine, ns: bytes, key: bytes) -> None:
    """The replica made equal to the primary again for the rows ERRANT touched."""
    _restore_rows(primary, replica, "orbit_tasks", ns, [key, bytes.fromhex("ee" * 16)])
    t = metadata.tables["orbit_task_attempts"]
    with primary.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(t.select().where(t.c.task_id == key))]
    with replica.begin() as conn:
        conn.execute(text("SET SESSION sql_log_bin = 0"))
        conn.execute(t.delete().where(t.c.namespace_id == ns, t.c.task_id == key))
        if rows:
            conn.execute(t.insert(), rows)


@pytest.mark.parametrize(
    ("change", "reader"), [("delete", "process"), ("update", "process"), ("insert", "thread")]
)
def test_an_errant_write_without_binlog_stops_the_job_until_the_replica_agrees(
    pair: ReplicaPair,
    dbs: tuple[str, str, Engine, Engine],
    tmp_path: Path,
    change: str,
    reader: str,
) -> None:
    """Issue 24 item 1: a root deleted, a child row changed or a root inserted on the replica
    alone (``sql_log_bin = 0``: no GTID). Before the job: its first read differs from the
    primary's, nothing but the manifest is confirmed. During the job (the change is in a later
    chunk): the files before it are confirmed, the chunk's are not. Each time the claim is given
    back without confirming (attempts not counted), the job waits `replica_diverged` (never
    SUCCEEDED with the replica's rows) and, once the replica is repaired, SUCCEEDS with the
    primary's rows -- files equal to a run read from the primary. The read-ahead runs in its
    reader process, and in threads of the runner's process."""
    primary_url, replica_url, primary, replica = dbs
    with archive_env(primary_url, primary, tmp_path, ORBIT_ARCHIVE_READER=reader) as ae:
        ns, q, vol, job = _replicated_job(ae, pair, f"errant-{change}", "tasks", 160, 4)
        with primary.connect() as conn:
            keys = source.root_keys_in_range(conn, "tasks", ns, job_store.job_range(conn, job))
        database = primary.url.database
        assert database is not None and len(keys) > 100

        def run() -> str:
            return _deliver(ae, job, vol, primary, replica)

        for key, confirmed in ((keys[0], lambda b: b == 0), (keys[-3], lambda b: b > 0)):
            pair.replica_local(database, *ERRANT[change](key))
            for _ in range(2):  # and again while the replica still differs
                assert run() == "stopped"
                held = ae.job(ns, job.id)
                assert held.state is JobState.PENDING and held.error_code == "", held
                assert _show(ae, held)["waiting"] == "replica_diverged", _show(ae, held)
                assert held.lease_id is None and confirmed(held.batches), held
                assert held.attempts == held.batches + 1  # the manifest's claim and one a file
                assert _show(ae, held)["waiting"] == "replica_diverged"
                on_disk = file_snapshot(vol, held)
                assert len(on_disk) == held.batches + 1  # nothing beyond the confirmed chain
            _repair(pair, primary, replica, ns, key)
        assert run() == "succeeded"
        done = ae.job(ns, job.id)
        assert done.roots == len(keys)
        assert_succeeded_exactly(ae, done, vol)
        shown = _show(ae, done)
        assert shown["waiting"] is None and shown["waited_seconds"]["replica_diverged"] > 0
        verify = ae.orbit("job", "verify", f"errant-{change}", job.id.hex(), "--volume", str(vol))
        assert verify.stdout.startswith("ok: "), verify.stdout
        from_replica = file_snapshot(vol, done)
        from_primary = _rerun_from_primary(ae, primary, done, tmp_path / "vol-primary")
        assert from_replica == from_primary


@pytest.mark.slow
def test_a_real_worker_stops_at_a_diverged_chunk_and_finishes_after_the_repair(
    pair: ReplicaPair, dbs: tuple[str, str, Engine, Engine], tmp_path: Path
) -> None:
    """A real `orbit worker archive` (its reader process) on the replica, a child row changed
    there alone in the range's last part: the worker logs `archive.job.replica_diverged`, the job
    waits with that reason through ticks; repaired, the job SUCCEEDS with the primary's rows."""
    primary_url, replica_url, primary, replica = dbs
    with archive_env(
        primary_url, primary, tmp_path, ORBIT_ARCHIVE_SOURCE_URL=replica_url,
        ORBIT_ARCHIVE_READER="process",
    ) as ae:  # fmt: skip
        ns, q, vol, job = _replicated_job(ae, pair, "worker-errant", "tasks", 120, 5)
        w = ae.worker("replica", [vol])
        with primary.connect() as conn:
            keys = source.root_keys_in_range(conn, "tasks", ns, job_store.job_range(conn, job))
        database = primary.url.database
        assert database is not None
        pair.replica_local(database, *ERRANT["update"](keys[-2]))
        wait_for(lambda: _show(ae, job)["waiting"] == "replica_diverged", 60, "diverged wait")
        assert "archive.job.replica_diverged" in w.text()
        exp_env = {k: v for k, v in ae.env.items() if k != "ORBIT_SENDER_DATABASE_URL"}
        exp_env.update(ORBIT_METRICS_CACHE_SECONDS="1")
        with running_exporter(exp_env, tmp_path) as exporter:  # the gauge the alert reads
            s = exporter.scrape()
            waiting = value(
                s,
                "orbit_archive_jobs_waiting",
                storage=job.storage_id.hex(),
                reason="replica_diverged",
            )
            assert waiting == 1
        for _ in range(3):
            ae.tick()
            time.sleep(1)
            held = ae.job(ns, job.id)
            assert held.state in (JobState.PENDING, JobState.RUNNING), held
        _repair(pair, primary, replica, ns, keys[-2])
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
        assert done.state is JobState.SUCCEEDED, done
        assert_succeeded_exactly(ae, done, vol)


def test_an_errant_gtid_is_refused_at_worker_start_and_at_the_claim(
    pair: ReplicaPair, dbs: tuple[str, str, Engine, Engine], tmp_path: Path
) -> None:
    """A transaction written on the replica WITH its binary log (a GTID of server 2 the primary
    never wrote): `orbit worker archive` refuses to start in one line naming it, and a claim
    waits `replica_diverged` (not claimed, attempts flat). Replicated transactions that move
    the replica's position past it do not hide it. Repaired (``RESET MASTER`` on the replica,
    docs/operations.md), the job runs."""
    primary_url, replica_url, primary, replica = dbs
    with archive_env(primary_url, primary, tmp_path) as ae:
        ns, q, vol, job = _replicated_job(ae, pair, "gtid", "events", 20, 5)
        database = primary.url.database
        assert database is not None
        env = orbit_env(primary_url, ORBIT_ARCHIVE_SOURCE_URL=replica_url)
        try:
            with pair.replica_admin.connect() as conn:
                conn.execute(text(f"CREATE TABLE `{database}`.errant_note (i INT)"))
                errant = conn.execute(text("SELECT @@gtid_binlog_pos")).scalar_one()
            assert errant.startswith("0-2-"), errant
            seed(primary, ns, q, "events", 3, seed=9)  # the primary moves on, and the replica
            pair.wait_caught_up()
            proc = _worker_start(env, vol)
            line = assert_one_line_error(proc, 1, "ORBIT_ARCHIVE_SOURCE_URL", "errant GTIDs")
            assert errant in line, line
            direct = run_celery_worker(env, queue_name(job.storage_id))  # started by celery itself
            assert direct.returncode == 1 and "celery@" not in direct.stdout, direct.stderr
            assert direct.stderr.strip().splitlines()[-1] == line.strip(), direct.stderr
            assert _deliver(ae, job, vol, primary, replica) == "waiting"
            held = ae.job(ns, job.id)
            assert (held.state, held.attempts, held.batches) == (JobState.PENDING, 0, 0), held
            assert _show(ae, held)["waiting"] == "replica_diverged"
        finally:
            with pair.replica_admin.connect() as conn:
                conn.execute(text("RESET MASTER"))
        assert _deliver(ae, job, vol, primary, replica) == "succeeded"
        assert_succeeded_exactly(ae, ae.job(ns, job.id), vol)


def _worker_start(env: dict[str, str], vol: Path) -> subprocess.CompletedProcess[str]:
    return run_orbit(["worker", "archive", "--volume", str(vol), "--no-control"], env, timeout=60)


def test_a_replica_that_cannot_connect_is_refused_in_one_line(
    dbs: tuple[str, str, Engine, Engine], tmp_path: Path
) -> None:
    primary_url, _replica_url, primary, _replica = dbs
    vol = tmp_path / "vol"
    make_volume(primary, vol)
    before = _checksums(primary)
    dead = f"mysql://root:s3cret@127.0.0.1:{free_port()}/nowhere"
    cases = [
        (dead, 1, ("ORBIT_ARCHIVE_SOURCE_URL", "unavailable")),
        (f"sqlite:///{tmp_path / 'x.sqlite3'}", 2, ("ORBIT_ARCHIVE_SOURCE_URL", "'sqlite'")),
        ("mysql://root@127.0.0.1:99999/x", 2, ("ORBIT_ARCHIVE_SOURCE_URL", "99999")),
        ("mysql://root@127.0.0.1:3306", 2, ("ORBIT_ARCHIVE_SOURCE_URL", "names no database")),
    ]
    for url, code, needles in cases:
        env = orbit_env(primary_url, ORBIT_ARCHIVE_SOURCE_URL=url)
        proc = _worker_start(env, vol)
        line = assert_one_line_error(proc, code, *needles)
        assert "s3cret" not in line
    assert _checksums(primary) == before
    assert not (tmp_path / "x.sqlite3").exists()


def test_a_replica_whose_source_tables_differ_is_refused_at_worker_start(
    pair: ReplicaPair, dbs: tuple[str, str, Engine, Engine], tmp_path: Path
) -> None:
    primary_url, replica_url, primary, _replica = dbs
    vol = tmp_path / "vol"
    sid = make_volume(primary, vol)
    pair.wait_caught_up()
    database = primary.url.database
    assert database is not None
    env = orbit_env(primary_url, ORBIT_ARCHIVE_SOURCE_URL=replica_url)
    changes = [
        (
            ["ALTER TABLE orbit_task_attempts ADD COLUMN note INT NULL"],
            ["ALTER TABLE orbit_task_attempts DROP COLUMN note"],
            ("orbit_task_attempts", "unexpected column note"),
        ),
        (
            ["CREATE INDEX ix_local ON orbit_events (created_at)"],
            ["DROP INDEX ix_local ON orbit_events"],
            ("orbit_events", "unexpected index ix_local"),
        ),
        (
            ["DROP TABLE orbit_archive_heartbeat"],
            [],
            ("orbit_archive_heartbeat", "missing on the replica"),
        ),
    ]
    for change, undo, needles in changes:
        pair.replica_local(database, *change)
        proc = _worker_start(env, vol)
        assert_one_line_error(proc, 1, "ORBIT_ARCHIVE_SOURCE_URL", *needles)
        # a worker started by celery itself gets the same check and line
        direct = run_celery_worker(env, queue_name(sid))
        assert direct.returncode == 1, (direct.stdout, direct.stderr)
        assert "Traceback" not in direct.stderr + direct.stdout, direct.stderr
        last = direct.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ORBIT_ARCHIVE_SOURCE_URL") and needles[1] in last, last
        assert "celery@" not in direct.stdout  # the worker never started (no banner)
        if undo:
            pair.replica_local(database, *undo)
    assert heartbeat.name == "orbit_archive_heartbeat"


def run_celery_worker(env: dict[str, str], queue: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "orbit_tasks.celery_app", "worker", "-Q", queue,
         "-P", "solo", "--without-mingle", "--without-gossip", "--without-heartbeat"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_source_engine_has_the_platform_session_bounds(
    dbs: tuple[str, str, Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's engine on the replica sets the same session bounds as the platform
    database's (the archive lease), and is a different server's engine."""
    from orbit_tasks.db import registry
    from orbit_tasks.db.session_bounds import bounds_for_lease
    from orbit_tasks.settings import get_settings
    from tests.support.cli import _reset_process_state

    primary_url, replica_url, _primary, _replica = dbs
    monkeypatch.setenv("ORBIT_DATABASE_URL", primary_url)
    monkeypatch.setenv("ORBIT_ARCHIVE_SOURCE_URL", replica_url)
    monkeypatch.setenv("ORBIT_ARCHIVE_LEASE_SECONDS", "40")
    _reset_process_state()
    try:
        src, platform = registry.source_engine(), registry.platform_engine()
        assert src is not platform and get_settings().archive_source_url == replica_url
        want = bounds_for_lease(40)
        for engine in (src, platform):
            with engine.connect() as conn:
                row = conn.execute(
                    text(
                        "SELECT @@session.idle_transaction_timeout, "
                        "@@session.innodb_lock_wait_timeout, @@server_id"
                    )
                ).one()
            assert (row[0], row[1]) == (want.idle_transaction_seconds, want.lock_wait_seconds)
        with src.connect() as a, platform.connect() as b:
            ids = [c.execute(text("SELECT @@server_id")).scalar() for c in (a, b)]
        assert ids == [2, 1]  # the reads go to the replica's server
    finally:
        monkeypatch.delenv("ORBIT_ARCHIVE_SOURCE_URL")
        _reset_process_state()
