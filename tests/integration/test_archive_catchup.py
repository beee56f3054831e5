"""Budget-sized ranges and catch-up (SPEC §5, issue 25 items 1, 2 and 6), on SQLite and MariaDB.

A backlog larger than a job's byte budget is archived as consecutive jobs that each fit their
budget: the first claim of a job cuts its range at a key chosen from a measured sample and an
exact count, records the end (``orbit_archive_job_ends``) and names it in the manifest; the
success of a cut job creates the plan's next job at once. At the end every settled root of the
archived span is in exactly one job's files (read here with ``gzip`` and ``json``, not with the
archive's own reader), every job verifies, none failed, and the ranges follow each other with
no gap and no overlap.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, select, update

from orbit_tasks.archive import claims
from orbit_tasks.archive.engine import claim_marks, runner
from orbit_tasks.archive.engine.verify import verify_job_dir
from orbit_tasks.archive.engine.volume import job_dir
from orbit_tasks.archive.format.manifest import decode_manifest
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.ranges import ArchiveRange, bound_key
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import source
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.migrate import alembic_config
from orbit_tasks.db.platform_tables import archive_job_ends, archive_jobs, archive_plans
from orbit_tasks.dev import generator
from orbit_tasks.platform import store as platform_store
from orbit_tasks.platform.history import HISTORY_KINDS
from orbit_tasks.settings import Settings, load_settings
from tests.support.archive_jobs import (
    ORBIT,
    REPO,
    ArchiveEnv,
    MiB,
    Worker,
    archive_env,
    make_due,
    make_namespace,
    make_plan,
    make_volume,
    wait_for,
    wait_marker,
)
from tests.support.cli import invoke_json, invoke_orbit, orbit_env
from tests.support.db import mariadb_database

KIND = "events"
HK = HISTORY_KINDS[KIND]


def _settings(url: str, tmp: Path) -> Settings:
    return load_settings({"ORBIT_DATABASE_URL": url, "ORBIT_VAR_DIR": str(tmp / "var")})


def _seed_events(
    engine: Engine, ns: bytes, n: int, *, at: datetime | None = None, seed: int = 1
) -> None:
    """``n`` settled event roots over the last two days, or all at the one instant ``at``."""
    spec = generator.make_spec(KIND, n, days=2, settled_fraction=1.0)
    with engine.begin() as conn:
        now = db_now(conn)
        for chunk in generator.generate(spec, ns, [], random.Random(seed), now):
            if at is not None:
                for root in chunk.roots:
                    root[HK.settled_column] = at
            generator.insert_chunk(conn, HK, chunk)


def _drain(
    engine: Engine, settings: Settings, volumes: dict[str, Path], limit: int = 200
) -> list[str]:
    """One tick, then every wake-up the deliveries publish (continuations and the catch-up's next
    jobs), delivered one after the other by the real runner in this process. Returns the
    outcomes."""
    woken: list[tuple[str, str]] = []

    def publish(storage_id: bytes, namespace_id: bytes, job_id: bytes, *, kind: str = "") -> None:
        woken.append((namespace_id.hex(), job_id.hex()))

    run_tick(engine, settings, publish=publish)
    outcomes: list[str] = []
    while woken and len(outcomes) < limit:
        ns_hex, job_hex = woken.pop(0)
        outcomes.append(
            runner.run_job(ns_hex, job_hex, volumes, settings, engine=engine, publish=publish).value
        )
    return outcomes


def _range(engine: Engine, job: Job) -> ArchiveRange:
    with engine.connect() as conn:
        return job_store.job_range(conn, job)


def _jobs(engine: Engine, ns: bytes) -> list[Job]:
    with engine.connect() as conn:
        return job_store.list_jobs(conn, ns, limit=1000)[0]


def _file_ids(volume: Path, job: Job) -> list[str]:
    """The root ids in a job's batch files, read with gzip and json alone (line 1 of a batch is
    its header)."""
    ids: list[str] = []
    for path in sorted(job_dir(volume, job.namespace_id, job.id).glob("*.jsonl.gz")):
        lines = gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")
        ids += [json.loads(line)["root"]["id"] for line in lines[1:] if line]
    return ids


def assert_caught_up(
    engine: Engine, ns: bytes, volumes: dict[bytes, Path], *, at_least: int = 2
) -> list[Job]:
    """Every job SUCCEEDED and verifies; their ranges follow each other (each starts at the end
    of the one before, the first at the beginning of time); the last one reaches its policy's
    ``until``; the files hold every root of the archived span exactly once, in key order; the
    plan has no active job. Returns the jobs, oldest first."""
    jobs = _jobs(engine, ns)
    assert len(jobs) >= at_least, [j.state for j in jobs]
    assert all(j.state is JobState.SUCCEEDED for j in jobs), [(j.state, j.error_code) for j in jobs]
    ranges = [_range(engine, j) for j in jobs]
    assert ranges[0].start is None
    reach = ranges[0].end  # the greatest end so far: each range starts there (an empty range,
    for rng in ranges[1:]:  # from a policy lengthened in between, moves nothing)
        assert rng.start is not None and bound_key(rng.start) == bound_key(reach)
        reach = max(reach, rng.end, key=bound_key)
    archived: list[str] = []
    for job, rng in zip(jobs, ranges, strict=True):
        volume = volumes[job.storage_id]
        expect = claims.with_range(claims.chain_expectation(job, complete=True), rng)
        d = job_dir(volume, job.namespace_id, job.id)
        report = verify_job_dir(d, expect)
        assert report.ok, (report.first_bad_file, report.reason)
        assert job.bytes <= job.max_bytes
        ids = _file_ids(volume, job)
        assert len(ids) == job.roots
        archived += ids
        with engine.connect() as conn:
            recorded = job_store.recorded_end(conn, job.namespace_id, job.id)
        assert (
            recorded is not None and recorded.end == rng.end and recorded.roots_total == job.roots
        )
    with engine.connect() as conn:
        recorded = job_store.recorded_end(conn, ns, jobs[-1].id)
        assert recorded is not None and not recorded.cut  # the last one reached the policy's end
        span = ArchiveRange(None, reach[0], None, reach[1])
        expected = [i.hex() for i in source.root_keys_in_range(conn, KIND, ns, span)]
        plan = conn.execute(
            select(archive_plans.c.active_job_id).where(archive_plans.c.namespace_id == ns)
        ).scalar()
    assert plan is None
    assert len(archived) == len(set(archived)), "a root archived twice"
    assert archived == expected
    return jobs


def test_a_backlog_over_the_budget_is_archived_as_consecutive_jobs_that_fit(
    any_platform_engine: Engine, any_platform_url: str, tmp_path: Path
) -> None:
    """Failed first (before the change): the one job FAILED BUDGET_EXCEEDED, for good. Now ~4
    jobs of at most 1 MiB each, created one by the success of the other, with no tick between
    them, and the plan's next_run_at (its phase) untouched by the catch-up."""
    engine = any_platform_engine
    settings = _settings(any_platform_url, tmp_path)
    ns, _q = make_namespace(engine, "backlog")
    vol = tmp_path / "vol"
    sid = make_volume(engine, vol, "vol")
    _seed_events(engine, ns, 40_000)
    make_plan(engine, ns, KIND, sid, batch_size=100, max_bytes=1 * MiB)
    with engine.connect() as conn:
        phase = conn.execute(select(archive_plans.c.next_run_at)).scalar()
    outcomes = _drain(engine, settings, {sid.hex(): vol})
    assert "failed" not in outcomes
    jobs = assert_caught_up(engine, ns, {sid: vol}, at_least=3)
    with engine.connect() as conn:
        ends = conn.execute(select(archive_job_ends)).all()
        after = conn.execute(select(archive_plans.c.next_run_at)).scalar()
    assert len(ends) == len(jobs)
    assert after == phase + timedelta(seconds=86400)  # the one tick's step; the catch-up none
    cut = [j for j in jobs[:-1]]
    assert all(j.bytes > 0.5 * MiB for j in cut), [j.bytes for j in cut]  # cut near the budget
    # job show says a range was cut short, and why; the last job's range was not cut
    env = orbit_env(any_platform_url)
    shown = invoke_json(["job", "show", ns.hex(), jobs[0].id.hex()], env)["range"]
    assert shown["cut"]["until"] == shown["until"] and "max_bytes 1048576" in shown["cut"]["reason"]
    assert "cut" not in invoke_json(["job", "show", ns.hex(), jobs[-1].id.hex()], env)["range"]
    text = invoke_orbit(["job", "show", ns.hex(), jobs[0].id.hex()], env).stdout
    assert f"cut short at {shown['until']}" in text


def test_a_burst_in_one_microsecond_is_split_between_jobs_by_keys(
    any_platform_engine: Engine, any_platform_url: str, tmp_path: Path
) -> None:
    """50,000 roots settled in one microsecond, 1 MiB per job: the range ends become keys
    (settled, id) inside that microsecond, the manifest's range names them (from_id, until_id),
    and the jobs still hold every root once."""
    engine = any_platform_engine
    settings = _settings(any_platform_url, tmp_path)
    ns, _q = make_namespace(engine, "burst")
    vol = tmp_path / "vol"
    sid = make_volume(engine, vol, "vol")
    with engine.connect() as conn:
        at = db_now(conn) - timedelta(days=1)
    _seed_events(engine, ns, 50_000, at=at)
    make_plan(engine, ns, KIND, sid, batch_size=100, max_bytes=1 * MiB)
    outcomes = _drain(engine, settings, {sid.hex(): vol})
    assert "failed" not in outcomes
    jobs = assert_caught_up(engine, ns, {sid: vol}, at_least=3)
    ranges = [_range(engine, j) for j in jobs]
    assert all(r.until == at and r.until_id is not None for r in ranges[:-1])
    assert all(r.from_ == at and r.from_id is not None for r in ranges[1:])
    manifest = next(job_dir(vol, ns, jobs[1].id).glob("00000000-*.json")).read_bytes()
    doc = decode_manifest(manifest)["range"]
    assert doc["from_id"] == ranges[1].from_id.hex()  # type: ignore[union-attr]
    assert doc["until_id"] == ranges[1].until_id.hex()  # type: ignore[union-attr]


@pytest.mark.mariadb
def test_the_cut_and_the_key_bounded_reads_use_the_settled_index(platform_engine: Engine) -> None:
    """EXPLAIN on MariaDB: the root read, the count and the cut's key walk of a range with key
    bounds are range scans of ix_<kind>_settled (the expanded OR form keeps the index). On a
    table with rows (an empty table makes any plan a full scan)."""
    ns, _q = make_namespace(platform_engine, "explain")
    _seed_events(platform_engine, ns, 5_000)
    _seed_events(platform_engine, make_namespace(platform_engine, "other")[0], 5_000, seed=2)
    with platform_engine.begin() as conn:
        conn.exec_driver_sql(f"ANALYZE TABLE {HK.root.name}")
        at = db_now(conn) - timedelta(days=1)
    rng = ArchiveRange(at, at + timedelta(hours=6), b"\x02" * 16, b"\x03" * 16)
    index = source.settled_index(HK)
    queries = [
        source.roots_query(KIND, ns, rng, (at, b"\x05" * 16), 101, server_times=True),
        source.keys_query(KIND, ns, rng, 10, 2),
        source.count_query(KIND, ns, rng),
    ]
    with platform_engine.connect() as conn:
        for q in queries:
            compiled = q.compile(conn)
            assert " OR " in str(compiled)  # the expanded keyset form, no row constructor
            cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            params = [compiled.params[p] for p in compiled.positiontup or ()]
            cur.execute("EXPLAIN " + str(compiled), params)
            (row,) = cur.fetchall()  # (id, select_type, table, type, possible_keys, key, ..)
            assert row[5] == index and row[3] == "range", (str(compiled), row)
            assert "filesort" not in (row[9] or ""), row


# --- through real workers ------------------------------------------------------------------------


def _wait_caught_up(
    ae: Any, ns: bytes, timeout: float, during: Callable[[], None] | None = None
) -> None:
    """Until the plan has no active job and every job is SUCCEEDED (a tick every 2 s, as beat)."""
    last = [time.monotonic()]

    def done() -> bool:
        if time.monotonic() - last[0] > 2:
            ae.tick()
            last[0] = time.monotonic()
        if during is not None:
            during()
        jobs = _jobs(ae.engine, ns)
        with ae.engine.connect() as conn:
            active = conn.execute(
                select(archive_plans.c.active_job_id).where(archive_plans.c.namespace_id == ns)
            ).scalar()
        return bool(jobs) and active is None and all(j.state is JobState.SUCCEEDED for j in jobs)

    wait_for(done, timeout, "the catch-up", 0.3)


@pytest.mark.mariadb
def test_real_workers_catch_up_through_a_sigkill_and_a_pause(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Real ``orbit worker archive`` processes: the first is SIGKILLed in the middle of the
    catch-up (its job is taken over after the lease), the scope is paused for a while (no batch
    is confirmed while paused) and resumed; the catch-up ends with every root once."""
    engine = platform_engine
    with archive_env(mariadb_url, engine, tmp_path) as ae:
        ns, _q = make_namespace(engine, "workers")
        vol = tmp_path / "vol"
        sid = make_volume(engine, vol, "vol")
        _seed_events(engine, ns, 40_000)
        make_plan(engine, ns, KIND, sid, batch_size=100, max_bytes=1 * MiB)
        first = ae.worker("w1", [vol])
        ae.tick()
        wait_for(lambda: len(_jobs(engine, ns)) >= 2, 120, "the second job of the catch-up")
        first.signal(signal.SIGKILL)
        first.stop()
        ae.orbit("archive", "pause", "--namespace", ns.hex(), "--reason", "test")
        ae.worker("w2", [vol])
        time.sleep(3)
        with engine.connect() as conn:
            paused = conn.execute(select(archive_jobs.c.batches, archive_jobs.c.id)).all()
        time.sleep(2)
        with engine.connect() as conn:
            still = conn.execute(select(archive_jobs.c.batches, archive_jobs.c.id)).all()
        assert sorted(still) == sorted(paused)  # nothing confirmed while paused
        ae.orbit("archive", "resume", "--namespace", ns.hex())
        _wait_caught_up(ae, ns, 240)
    assert_caught_up(engine, ns, {sid: vol}, at_least=3)


@pytest.mark.mariadb
def test_real_workers_catch_up_through_a_policy_shortened_and_lengthened(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """The policy changes twice in the middle of the catch-up (lengthened from 1 h to 36 h, then
    shortened back to 1 h): a catch-up job takes the plan's policy as it is when it is created,
    a range behind the archived span is empty, the ranges stay contiguous and disjoint, and the
    catch-up (or the next due run) takes the rest."""
    engine = platform_engine
    with archive_env(mariadb_url, engine, tmp_path) as ae:
        ns, _q = make_namespace(engine, "policy")
        vol = tmp_path / "vol"
        sid = make_volume(engine, vol, "vol")
        _seed_events(engine, ns, 30_000)
        make_plan(engine, ns, KIND, sid, batch_size=100, max_bytes=1 * MiB)
        ae.worker("w1", [vol])
        ae.tick()
        wait_for(lambda: len(_jobs(engine, ns)) >= 2, 120, "the second job of the catch-up")
        for after in ("36h", "1h"):  # lengthened (less history to archive), then shortened
            out = ae.orbit("policy", "set", ns.hex(), KIND, "--archive-after", after, "--json")
            rev = json.loads(out.stdout)["revision"]
            ae.orbit("plan", "set", ns.hex(), KIND, "--policy-revision", str(rev))
            time.sleep(1)
        _wait_caught_up(ae, ns, 240)
        before = len(_jobs(engine, ns))
        make_due(engine, ns, KIND)  # the next interval: the rest of the history under 1h
        ae.tick()
        assert len(_jobs(engine, ns)) == before + 1
        _wait_caught_up(ae, ns, 240)
    assert_caught_up(engine, ns, {sid: vol}, at_least=3)


def _beat(ae: ArchiveEnv) -> Worker:
    """A real ``orbit beat`` (archive ticks only: no sender database named), stopped with the
    workers at the end of the test."""
    env = {k: v for k, v in ae.env.items() if k != "ORBIT_SENDER_DATABASE_URL"}
    log = ae.tmp / "beat.log"
    fh = open(log, "wb")  # noqa: SIM115 - closed in Worker.stop
    proc = subprocess.Popen(
        [ORBIT, "beat", "-l", "INFO"], cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    beat = Worker("beat", proc, log, fh)
    ae.workers.append(beat)
    return beat


def _ready(w: Worker) -> None:
    wait_for(lambda: "ready." in w.text() or w.proc.poll() is not None, 60, f"{w.name} ready")
    assert w.proc.poll() is None, w.text()


def _mark_of(ae: ArchiveEnv, pid: int) -> claim_marks.Mark | None:
    """The claim mark of the pool child ``pid`` (under its worker's main process)."""
    for path in (ae.settings.var_dir / claim_marks.MARKS_DIR).glob(f"*/{pid}"):
        return claim_marks.read_mark(path)
    return None


# The after_file_write hit (the manifest and each batch file, counted per pool child) at which
# the first pool child pauses: in the second job (a 1 MiB job of these roots holds ~10.4k roots,
# ~106 files), and more than the new child writes after the takeover (~110), so that it pauses
# once only.
PAUSE_AT = 150


@pytest.mark.mariadb
def test_real_workers_and_beat_catch_up_through_a_pool_child_killed_mid_job(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Real ``orbit worker archive``, ``orbit worker control`` and ``orbit beat`` processes, the
    default 120 s lease: the pool child is SIGKILLed in the middle of the catch-up's second job
    (paused after a durable write, before its confirm, holding the claim); its worker's main
    process lives on and has the job taken over within seconds (no tick or lease can do that
    here: the lease has two minutes to run), and the catch-up ends with every root once."""
    engine = platform_engine
    marker = tmp_path / "paused"
    lease = 120
    with archive_env(
        mariadb_url, engine, tmp_path, ORBIT_ARCHIVE_LEASE_SECONDS=str(lease),
        ORBIT_TICK_SECONDS="2",
    ) as ae:  # fmt: skip
        ns, _q = make_namespace(engine, "childkill")
        vol = tmp_path / "vol"
        sid = make_volume(engine, vol, "vol")
        # the processes start while the roots are seeded (a wake-up or tick published before a
        # worker is ready is dropped: the next tick creates the job or sweeps it again)
        pause = f"archive.after_file_write=pause@{PAUSE_AT}:{marker}"
        w = ae.worker("w1", [vol], failpoints=pause, wait_ready=False)
        ctl = ae.worker("control", [], wait_ready=False)  # beat's ticks run here
        _seed_events(engine, ns, 25_000)
        make_plan(engine, ns, KIND, sid, batch_size=100, max_bytes=1 * MiB)
        beat = _beat(ae)
        _ready(w)
        _ready(ctl)
        pid = wait_marker(marker, 120)
        assert pid != w.proc.pid  # a pool child, not the worker's main process
        mark = _mark_of(ae, pid)
        assert mark is not None and mark.ns_id == ns
        jobs = _jobs(engine, ns)
        held = next(j for j in jobs if j.id == mark.job_id)
        # the child holds the claim in the middle of a job that is not the first
        assert held.state is JobState.RUNNING and held.lease_id == mark.lease_id, held
        assert held.id != jobs[0].id and jobs[0].state is JobState.SUCCEEDED
        assert held.batches > 0, held
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()

        def taken_over() -> Job | None:
            now = ae.job(ns, held.id)
            return now if now.attempts > held.attempts else None

        after = wait_for(taken_over, 20, "a takeover after the child's death", 0.05)
        took = time.monotonic() - killed_at
        assert after.lease_id != mark.lease_id
        assert took < lease / 4

        def caught_up() -> bool:
            again = marker.read_text()
            assert again == str(pid), f"a second pause (child {again}): PAUSE_AT no longer fits"
            with engine.connect() as conn:
                active = conn.execute(
                    select(archive_plans.c.active_job_id).where(archive_plans.c.namespace_id == ns)
                ).scalar()
            now = _jobs(engine, ns)
            assert not any(j.state is JobState.FAILED for j in now), now
            return active is None and all(j.state is JobState.SUCCEEDED for j in now)

        wait_for(caught_up, 120, "the catch-up after the takeover", 0.3)
        assert w.proc.poll() is None and beat.proc.poll() is None  # both lived on
        assert "orbit.archive.tick" in beat.text()  # beat's ticks created the first job
        assert "archive.job.child_lost" in w.text()
        assert _mark_of(ae, pid) is None  # the dead child's mark is gone
    jobs = assert_caught_up(engine, ns, {sid: vol}, at_least=3)
    (done,) = [j for j in jobs if j.id == held.id]
    assert done.roots > held.roots and done.attempts > held.attempts  # taken over mid-job
    print(f"takeover {took:.2f} s after the SIGKILL (lease {lease} s), {len(jobs)} jobs")


# --- item 6: a job that failed BUDGET_EXCEEDED before the upgrade ---------------------------------


def _plan_as_before(engine: Engine, ns: bytes, sid: bytes) -> None:
    """The plan as an earlier release left it: its policy revision and its row, written at the
    old revision directly (today's ``plan set`` reads tables of later revisions, such as the
    retired storages of p0007, that a database at p0003 does not have)."""
    with engine.begin() as conn:
        rev = platform_store.add_policy_revision(conn, ns, KIND, 3600, "test")
        conn.execute(
            archive_plans.insert().values(
                namespace_id=ns, kind=KIND, revision=1, enabled=True, policy_revision=rev,
                storage_id=sid, interval_seconds=86400, batch_size=100, max_bytes=1 * MiB,
                next_run_at=db_now(conn),
            )
        )  # fmt: skip


@pytest.mark.mariadb
@pytest.mark.parametrize("way_out", ["abandon", "retry"])
def test_a_budget_exceeded_job_from_before_the_upgrade_has_a_way_out(
    tmp_path: Path, way_out: str
) -> None:
    """A database at p0003 (the revision before p0006) holds a job FAILED BUDGET_EXCEEDED with
    no batch; after ``orbit db upgrade``: ``job abandon`` + the plan due again (disable/enable)
    lets the next job cut its range, or ``job retry`` re-cuts the job itself (it has no
    manifest yet); either way the backlog is caught up with every root once."""
    with mariadb_database("orbit_p3") as url:
        engine = make_engine(url)
        with engine.connect() as conn, conn.begin():
            cfg = alembic_config("platform")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "p0003")
        settings = _settings(url, tmp_path)
        ns, _q = make_namespace(engine, "old")
        vol = tmp_path / "vol"
        sid = make_volume(engine, vol, "vol")
        _seed_events(engine, ns, 25_000)
        _plan_as_before(engine, ns, sid)
        # the tick as the earlier release ran it: no scrub (p0010's tables do not exist yet)
        old_tick = settings.with_overrides(archive_scrub_days=0)
        report = run_tick(engine, old_tick, publish=lambda *a, **k: None)
        ((_, _, job_hex),) = report.jobs_created
        with engine.begin() as conn:  # as the previous release left it
            conn.execute(
                update(archive_jobs)
                .where(archive_jobs.c.id == bytes.fromhex(job_hex))
                .values(state="FAILED", error_code="BUDGET_EXCEEDED", attempts=1)
            )
        with archive_env(url, engine, tmp_path) as ae:
            ae.orbit("db", "upgrade")
            if way_out == "abandon":
                ae.orbit("job", "abandon", ns.hex(), job_hex)
                ae.orbit("plan", "set", ns.hex(), KIND, "--disable")
                ae.orbit("plan", "set", ns.hex(), KIND, "--enable")
            else:
                ae.orbit("job", "retry", ns.hex(), job_hex)
            outcomes = _drain(engine, settings, {sid.hex(): vol}) if way_out == "abandon" else []
            if way_out == "retry":
                woken: list[str] = []
                pub = lambda s, n, j, kind="": woken.append(j.hex())  # noqa: E731
                runner.run_job(
                    ns.hex(), job_hex, {sid.hex(): vol}, settings, engine=engine, publish=pub
                )
                while woken:
                    outcomes.append(
                        runner.run_job(
                            ns.hex(),
                            woken.pop(0),
                            {sid.hex(): vol},
                            settings,
                            engine=engine,
                            publish=pub,
                        ).value
                    )
        assert "failed" not in outcomes
        jobs = _jobs(engine, ns)
        if way_out == "abandon":
            assert jobs[0].state is JobState.ABANDONED
            with engine.begin() as conn:  # the abandoned job is no part of the archive
                conn.execute(archive_jobs.delete().where(archive_jobs.c.id == jobs[0].id))
        assert_caught_up(engine, ns, {sid: vol}, at_least=2)
        engine.dispose()


@pytest.mark.mariadb
def test_two_namespaces_catch_up_side_by_side_on_one_storage(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Two backlogs on one storage and one worker process: the catch-ups share it (time slices,
    and each next job queued behind the other's wake-ups): each namespace's first job succeeds
    before the other's last one; both end with every root once."""
    engine = platform_engine
    with archive_env(mariadb_url, engine, tmp_path) as ae:
        vol = tmp_path / "vol"
        sid = make_volume(engine, vol, "vol")
        names = []
        for i, name in enumerate(("left", "right")):
            ns, _q = make_namespace(engine, name)
            _seed_events(engine, ns, 25_000, seed=10 + i)
            make_plan(engine, ns, KIND, sid, batch_size=100, max_bytes=1 * MiB)
            names.append(ns)
        ae.worker("w1", [vol])
        ae.tick()
        for ns in names:
            _wait_caught_up(ae, ns, 300)
    done = {ns: assert_caught_up(engine, ns, {sid: vol}, at_least=3) for ns in names}
    left, right = (done[ns] for ns in names)
    assert left[0].updated_at < right[-1].updated_at and right[0].updated_at < left[-1].updated_at
