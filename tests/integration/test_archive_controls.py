"""Archive controls end to end (issue 16, docs/archive-controls.md): real MariaDB, Redis db 2,
volume directories, `orbit worker archive` (= `celery worker`) processes and the real CLI.

Pause a running job (stops within one batch, stays PENDING with attempts flat for more than
three lease periods, resumes and verifies); pause by namespace; a run window that closes
mid-job; the load guard; statistics in `orbit job show --json`; the exporter's
`orbit_archive_jobs_waiting`; bad input refused with one line and nothing written.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, select, text

from orbit_tasks.archive.claims import GROUP_FILES
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.db.engine import DB_CLOCK, db_now
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_jobs as J
from tests.support.archive_jobs import (
    ArchiveEnv,
    archive_env,
    assert_succeeded_exactly,
    cli_json,
    create_job,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_for,
    wait_state,
)
from tests.support.metrics import running_exporter, value
from tests.support.scene import archive_scene, deliver_in_thread
from tests.support.schema import mariadb_snapshot

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]

LEASE = 4  # seconds: the smallest lease (slice 1 s), so three lease periods are 12 s
SLOW_FILE = "archive.after_file_write=sleep:0.15"  # every file takes a while: pauses hit mid-job


def _show(ae: ArchiveEnv, job: Job) -> dict:
    return cli_json(ae.orbit("job", "show", job.namespace_id.hex(), job.id.hex(), "--json"))


def _hold(ae: ArchiveEnv, job: Job, seconds: float) -> Job:
    """Tick every 2 s (as beat would) for ``seconds``; the job must stay PENDING with its
    attempts, batches and error code unchanged all along. Returns the job as it stayed."""
    first = ae.job(job.namespace_id, job.id)
    assert first.state is JobState.PENDING, first
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ae.tick()
        now = ae.job(job.namespace_id, job.id)
        assert now.state is JobState.PENDING and now.error_code == "", now
        assert (now.attempts, now.batches, now.revision) == (
            first.attempts,
            first.batches,
            first.revision,
        ), now
        time.sleep(1)
    return first


def _hold_over_leases(ae: ArchiveEnv, job: Job, leases: int) -> Job:
    """:func:`_hold` for 2 s, then ticks on the database clock moved on, one lease period at a
    time, past ``leases`` lease periods (the sweep decides as it would then, without waiting
    for it); the job must stay as it was all along. Returns the job as it stayed."""
    from orbit_tasks.archive.tick import run_tick
    from orbit_tasks.archive.wakeups import make_publisher
    from orbit_tasks.db.engine import FixedClock

    first = _hold(ae, job, 2)
    with ae.engine.connect() as conn:
        now = db_now(conn)
    for k in range(1, leases + 2):
        clock = FixedClock(now + timedelta(seconds=k * LEASE))
        run_tick(ae.engine, ae.settings, publish=make_publisher(ae.app), clock=clock)
        time.sleep(0.2)  # a wake-up it might have sent reaches the worker
        moved = ae.job(job.namespace_id, job.id)
        assert moved.state is JobState.PENDING and moved.error_code == "", (k, moved)
        assert (moved.attempts, moved.batches, moved.revision) == (
            first.attempts,
            first.batches,
            first.revision,
        ), (k, moved)
    return first


def _verify(ae: ArchiveEnv, job: Job, vol: Path) -> None:
    proc = ae.orbit("job", "verify", job.namespace_id.hex(), job.id.hex(), "--volume", str(vol))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_pause_stops_a_running_job_within_one_batch_then_resume_finishes(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(
        mariadb_url, platform_engine, tmp_path,
        ORBIT_ARCHIVE_LEASE_SECONDS=str(LEASE), ORBIT_ARCHIVE_SLICE_SECONDS="1",
    ) as ae:  # fmt: skip
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="pause",
            volume=tmp_path / "vol",
            kind="events",
            roots=400,
            batch_size=5,
        ).parts
        w = ae.worker("pause", [vol], failpoints=SLOW_FILE)
        job = create_job(ae, ns, "events")
        wait_for(lambda: ae.job(ns, job.id).batches >= 4, 60, "four batches")
        ae.orbit("archive", "pause", "--storage", sid.hex(), "--reason", "db maintenance")
        at_pause = ae.job(ns, job.id)  # read after the pause committed
        stopped = wait_for(
            lambda: (j := ae.job(ns, job.id)).state is JobState.PENDING and j, 10, "stopped"
        )
        # at most the files already written: the group in hand (an unconstrained chain writes
        # groups until it sees a control; then one file per confirm)
        assert stopped.batches <= at_pause.batches + GROUP_FILES
        assert stopped.error_code == "" and stopped.lease_id is None
        assert stopped.attempts == stopped.batches + 1  # released without a claim of its own
        with platform_engine.connect() as conn:
            stopped_at = db_now(conn)  # the wait began before this
        held = _hold_over_leases(ae, stopped, 3)  # longer than three lease periods
        log = w.text()
        assert "archive.job.stopped" in log or "archive.job.waiting" in log, log[-2000:]
        assert "STALLED" not in log
        with platform_engine.connect() as conn:
            held_for = (db_now(conn) - stopped_at).total_seconds()
        st = _show(ae, held)["statistics"]
        assert st["waiting"] == "paused", st
        assert st["waited_seconds"]["paused"] >= held_for > 0, (st, held_for)

        controls = cli_json(ae.orbit("archive", "controls", "--json"))
        assert controls["next"] is None
        (item,) = controls["items"]
        assert (item["control"], item["storage_id"], item["namespace_id"]) == (
            "pause",
            sid.hex(),
            None,
        )
        assert (item["reason"], item["actor"]) == ("db maintenance", "test-operator")
        human = ae.orbit("archive", "controls").stdout
        assert "pause" in human and "db maintenance" in human and "test-operator" in human

        w.stop()  # while the job waits (no lease): the rest at full speed
        ae.worker("pause-fast", [vol])
        ae.orbit("archive", "resume", "--storage", sid.hex())
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=180)
        assert done.state is JobState.SUCCEEDED, done
        assert done.attempts == done.batches + 1
        assert_succeeded_exactly(ae, done, vol)
        _verify(ae, done, vol)
        st = _show(ae, done)["statistics"]
        assert st["waiting"] is None and st["waited_seconds"]["paused"] >= held_for, st
        assert st["elapsed_seconds"] > 0 and st["roots_per_second"] > 0
        text_show = ae.orbit("job", "show", ns.hex(), job.id.hex()).stdout
        assert "roots/s" in text_show and "paused " in text_show, text_show
        watched = ae.orbit("job", "watch", ns.hex(), job.id.hex(), "--json").stdout
        assert json.loads(watched.splitlines()[-1])["statistics"]["waited_seconds"]["paused"] > 0
        assert "waiting" not in ae.orbit("job", "watch", ns.hex(), job.id.hex()).stdout
        assert cli_json(ae.orbit("archive", "controls", "--json"))["items"] == []
        with platform_engine.connect() as conn:
            actions = [
                r.action
                for r in conn.execute(
                    select(audit_events.c.action, audit_events.c.actor).where(
                        audit_events.c.namespace_id == bytes(16)
                    )
                )
            ]
        assert actions.count("archive.pause") == 1 and actions.count("archive.resume") == 1


@pytest.mark.slow
def test_pause_by_namespace_leaves_another_namespace_on_the_storage_running(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        vol = tmp_path / "vol"
        sid = make_volume(platform_engine, vol)
        ns_a, qa = make_namespace(platform_engine, "paused-ns")
        ns_b, qb = make_namespace(platform_engine, "running-ns")
        for ns, q in ((ns_a, qa), (ns_b, qb)):
            make_plan(platform_engine, ns, "events", sid, batch_size=10)
            seed(platform_engine, ns, q, "events", 60)
        ae.orbit("archive", "pause", "--namespace", "paused-ns", "--reason", "tenant move")
        ae.worker("ns", [vol])
        report = ae.tick()  # creates both jobs, wakes only the unpaused one
        assert len(report.jobs_created) == 2 and report.wakeups_published == 1
        by_ns = {bytes.fromhex(n): bytes.fromhex(j) for n, _k, j in report.jobs_created}
        job_a, job_b = ae.job(ns_a, by_ns[ns_a]), ae.job(ns_b, by_ns[ns_b])
        done_b = wait_state(ae, job_b, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
        assert done_b.state is JobState.SUCCEEDED, done_b
        a = ae.job(ns_a, job_a.id)
        assert (a.state, a.attempts, a.batches) == (JobState.PENDING, 0, 0)
        assert ae.tick().wakeups_published == 0  # the paused job gets none
        # a wake-up reaching a worker anyway (late, duplicated) claims nothing
        ae.publish(sid, ns_a, job_a.id, kind="events")
        time.sleep(2)
        a = ae.job(ns_a, job_a.id)
        assert (a.state, a.attempts) == (JobState.PENDING, 0)
        ae.orbit("archive", "resume", "--namespace", "paused-ns")
        done_a = wait_state(ae, job_a, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
        assert done_a.state is JobState.SUCCEEDED, done_a
        assert_succeeded_exactly(ae, done_a, vol)
        assert done_a.attempts == done_a.batches + 1


@pytest.mark.slow
def test_a_run_window_that_closes_mid_job(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window covers one minute and closes at its end (minute resolution, UTC): the running
    claim stops at a batch boundary and the job waits `window`; a wider window lets a real
    worker finish it. No wait for a minute boundary: the claim runs in this process on the
    database clock moved to 8 s before the end of the last whole minute (the runner's own
    `run_job`, as a worker runs it; its gate estimates the time from that clock and the
    monotonic clock), with every file slow so that the end comes mid-job."""
    from orbit_tasks.archive.engine import runner
    from orbit_tasks.db.engine import FixedClock

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="window",
            volume=tmp_path / "vol",
            kind="events",
            roots=3000,
            batch_size=5,
        ).parts
        with platform_engine.connect() as conn:
            now = db_now(conn)
        end = now.replace(second=0, microsecond=0)  # passed: the waits recorded on the moved
        start = end - timedelta(minutes=1)  # clock are not ahead of the real one
        window = f"{start:%H:%M}-{end:%H:%M}"
        ae.orbit("archive", "window", "--storage", sid.hex(), window)
        job = create_job(ae, ns, "events")
        clock = FixedClock(end - timedelta(seconds=8))
        settings = ae.settings.with_overrides(archive_slice_seconds=10)  # the window ends first
        monkeypatch.setenv("ORBIT_FAILPOINTS", SLOW_FILE)
        outcome = runner.run_job(
            ns.hex(), job.id.hex(), {sid.hex(): vol}, settings, engine=platform_engine,
            publish=lambda *a, **k: None, clock=clock,
        )  # fmt: skip
        monkeypatch.delenv("ORBIT_FAILPOINTS")
        assert outcome == "stopped", outcome
        closed = ae.job(ns, job.id)
        assert closed.batches >= 2, closed  # work inside the window
        assert closed.state is JobState.PENDING and closed.batches < 600  # stopped mid-job
        assert closed.attempts == closed.batches + 1
        assert _show(ae, closed)["statistics"]["waiting"] == "window"
        with platform_engine.connect() as conn:
            assert db_now(conn) >= end
        _hold(ae, closed, 5)
        ae.worker("window-fast", [vol])
        ae.orbit("archive", "window", "--storage", sid.hex(), "00:00-23:59", "23:59-00:00")
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=240)
        assert done.state is JobState.SUCCEEDED, done
        assert done.attempts == done.batches + 1
        assert_succeeded_exactly(ae, done, vol)
        assert _show(ae, done)["statistics"]["waited_seconds"]["window"] > 0


@pytest.mark.slow
def test_load_guard_waits_db_load_then_finishes(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """A threshold below the server's Threads_running (0: the check's own statement runs) makes
    the job wait `db_load` without a claim; the exporter counts it; a worker with a higher
    threshold finishes it."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="load",
            volume=tmp_path / "vol",
            kind="events",
            roots=50,
            batch_size=10,
        ).parts
        busy = ae.worker("busy", [vol], extra_env={"ORBIT_ARCHIVE_MAX_THREADS_RUNNING": "0"})
        job = create_job(ae, ns, "events")
        wait_for(lambda: "archive.job.waiting" in busy.text(), 30, "the worker saw the load")
        j = _hold(ae, ae.job(ns, job.id), 4)
        assert (j.attempts, j.batches) == (0, 0)
        st = _show(ae, j)["statistics"]
        assert st["waiting"] == "db_load" and st["waited_seconds"]["db_load"] > 0, st
        exp_env = {k: v for k, v in ae.env.items() if k != "ORBIT_SENDER_DATABASE_URL"}
        exp_env.update(ORBIT_METRICS_CACHE_SECONDS="1")
        with running_exporter(exp_env, tmp_path) as exporter:
            s = exporter.scrape()
            assert value(s, "orbit_archive_jobs_waiting", storage=sid.hex(), reason="db_load") == 1
            assert value(s, "orbit_archive_jobs_waiting", storage=sid.hex(), reason="paused") == 0
        busy.stop()
        ae.worker("calm", [vol], extra_env={"ORBIT_ARCHIVE_MAX_THREADS_RUNNING": "100000"})
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
        assert done.state is JobState.SUCCEEDED, done
        assert done.attempts == done.batches + 1
        assert_succeeded_exactly(ae, done, vol)


@pytest.mark.slow
def test_load_guard_stops_a_running_claim_when_the_server_gets_busy(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Sessions of `SELECT SLEEP(n)` raise Threads_running above the threshold while the job
    runs: the claim stops at a batch boundary (read at most once a second) and the job waits
    `db_load`; when they end it continues (on a worker without the slow files) and finishes."""
    sleepers, threshold = 45, 30
    with archive_env(
        mariadb_url, platform_engine, tmp_path,
        ORBIT_ARCHIVE_LEASE_SECONDS=str(LEASE), ORBIT_ARCHIVE_SLICE_SECONDS="1",
    ) as ae:  # fmt: skip
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="load-mid",
            volume=tmp_path / "vol",
            kind="events",
            roots=1500,
            batch_size=5,
        ).parts
        env = {"ORBIT_ARCHIVE_MAX_THREADS_RUNNING": str(threshold)}
        slow = ae.worker("mid", [vol], failpoints=SLOW_FILE, extra_env=env)
        job = create_job(ae, ns, "events")
        wait_for(lambda: ae.job(ns, job.id).batches >= 3, 30, "work before the load")
        load = create_engine(mariadb_url, pool_size=sleepers, max_overflow=0)

        def sleep_in_server() -> None:
            with load.connect() as conn:
                conn.execute(text("SELECT SLEEP(12)"))

        threads = [threading.Thread(target=sleep_in_server) for _ in range(sleepers)]
        for t in threads:
            t.start()
        try:
            wait_for(
                lambda: _show(ae, job)["statistics"]["waiting"] == "db_load",
                10,
                "the job waits for the load",
                step=0.5,
            )
            busy = ae.job(ns, job.id)
            assert busy.state is JobState.PENDING and busy.batches < 300
            slow.stop()  # while the job waits (no lease): the slow files outlasted the load
        finally:
            for t in threads:
                t.join()
            load.dispose()
        ae.worker("mid-fast", [vol], extra_env=env)  # the rest at full speed, still guarded
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=240)
        assert done.state is JobState.SUCCEEDED, done
        assert done.attempts == done.batches + 1
        assert_succeeded_exactly(ae, done, vol)


# --- bad input: one line, the right exit code, nothing written ----------------------------------


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (["pause", "--storage", "ab" * 16, "--reason", "x"], 4, "storage " + "ab" * 16),
        (["pause", "--storage", "nothex", "--reason", "x"], 2, "storage id"),
        (["pause", "--namespace", "nope", "--reason", "x"], 4, "namespace 'nope' does not exist"),
        (["pause", "--namespace", "ctl", "--kind", "bogus", "--reason", "x"], 2, "bogus"),
        (["pause", "--kind", "events", "--reason", "x"], 2, "--kind 'events' needs --namespace"),
        (["pause", "--reason", ""], 2, "--reason"),
        (["pause"], 2, "--reason"),
        (["resume", "--namespace", "nope"], 4, "namespace 'nope' does not exist"),
        (["throttle", "--storage", "@S", "--max-roots-per-second", "0"], 2, "1..10,000,000"),
        (["throttle", "--storage", "@S", "--max-roots-per-second", "-5"], 2, "1..10,000,000"),
        (["throttle", "--storage", "@S", "--max-roots-per-second", "2.5"], 2, "not an integer"),
        (["throttle", "--storage", "@S"], 2, "--max-roots-per-second N or --clear"),
        (["throttle", "--max-roots-per-second", "5"], 2, "exactly one of --storage"),
        (
            ["throttle", "--storage", "@S", "--namespace", "ctl", "--max-roots-per-second", "5"],
            2,
            "exactly one of --storage",
        ),
        (["throttle", "--namespace", "nope", "--max-roots-per-second", "5"], 4, "'nope'"),
        (["window", "--storage", "@S", "01:00-01:00"], 2, "'01:00-01:00' is empty"),
        (["window", "--storage", "@S", "25:00-02:00"], 2, "'25:00-02:00' is invalid"),
        (["window", "--storage", "@S", "1-2"], 2, "'1-2' is invalid"),
        (["window", "--storage", "@S"], 2, "no window given"),
        (["window", "--storage", "@S", "--clear", "01:00-02:00"], 2, "not both"),
        (["window", "--namespace", "nope", "01:00-02:00"], 4, "'nope'"),
    ],
)
def test_bad_control_input_is_refused_in_one_line_and_nothing_is_written(
    platform_engine: Engine,
    mariadb_url: str,
    tmp_path: Path,
    args: list[str],
    code: int,
    line: str,
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        make_namespace(platform_engine, "ctl")
        sid = make_volume(platform_engine, tmp_path / "vol")
        args = [sid.hex() if a == "@S" else a for a in args]
        before = mariadb_snapshot(mariadb_url)
        proc = ae.orbit("archive", *args, check=False)
        assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
        assert line in lines[0], lines[0]
        assert "Traceback" not in proc.stderr and proc.stdout == ""
        assert mariadb_snapshot(mariadb_url) == before


def test_control_changes_are_audited_and_listed(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path, ORBIT_OPERATOR="alice") as ae:
        ns, _ = make_namespace(platform_engine, "ctl")
        sid = make_volume(platform_engine, tmp_path / "vol")
        ae.orbit("archive", "throttle", "--storage", sid.hex(), "--max-roots-per-second", "500")
        ae.orbit("archive", "window", "--namespace", "ctl", "22:00-02:00", "12:00-13:00")
        ae.orbit("archive", "pause", "--namespace", "ctl", "--kind", "tasks", "--reason", "r")
        ae.orbit("archive", "pause", "--reason", "all of it")
        items = cli_json(ae.orbit("archive", "controls", "--json"))["items"]
        got = {(i["control"], i["scope"]): i for i in items}
        assert set(got) == {
            ("throttle", f"{sid.hex()}/*/*"),
            ("window", f"*/{ns.hex()}/*"),
            ("pause", f"*/{ns.hex()}/tasks"),
            ("pause", "*/*/*"),
        }
        assert got[("throttle", f"{sid.hex()}/*/*")]["max_roots_per_second"] == 500
        assert got[("window", f"*/{ns.hex()}/*")]["windows"] == ["22:00-02:00", "12:00-13:00"]
        assert got[("window", f"*/{ns.hex()}/*")]["namespace"] == "ctl"
        assert {i["actor"] for i in items} == {"alice"}
        nothing = ae.orbit("archive", "resume", "--storage", sid.hex())
        assert "nothing to resume" in nothing.stdout
        ae.orbit("archive", "throttle", "--storage", sid.hex(), "--clear")
        ae.orbit("archive", "window", "--namespace", "ctl", "--clear")
        with platform_engine.connect() as conn:
            rows = conn.execute(
                select(audit_events.c.namespace_id, audit_events.c.action, audit_events.c.actor)
            ).all()
        actions = sorted((bytes(r[0]) == ns, r[1]) for r in rows)
        assert actions == [
            (False, "archive.pause"),
            (False, "archive.throttle.clear"),
            (False, "archive.throttle.set"),
            (True, "archive.pause"),
            (True, "archive.window.clear"),
            (True, "archive.window.set"),
        ]
        assert {r[2] for r in rows} == {"alice"}
        left = cli_json(ae.orbit("archive", "controls", "--json"))["items"]
        assert [i["control"] for i in left] == ["pause", "pause"]


@pytest.mark.slow
@pytest.mark.heavy
def test_a_throttle_paces_two_workers_on_one_storage(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Two `celery worker` processes, one job each on one throttled storage: over 10 s of
    database time the confirmed roots of both together stay within +10% of the rate (the
    budget is one for the scope, taken from the database clock, so the span is measured on that
    clock too: the roots and the clock read by one statement). The budget's own bound (rate x
    span + one charge per taker, plus a batch in flight per job: 40 roots here) is within +10%
    from a 4 s span on. The loose lower bound only says both made progress on a loaded machine.
    Timing-sensitive: run under `flock /tmp/orbit-heavy.lock`."""
    rate, window = 100, 10.0
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        vol = tmp_path / "vol"
        sid = make_volume(platform_engine, vol)
        namespaces = []
        for name in ("thr-a", "thr-b"):
            ns, q = make_namespace(platform_engine, name)
            make_plan(platform_engine, ns, "events", sid, batch_size=10)
            seed(platform_engine, ns, q, "events", 2500)
            namespaces.append(ns)
        ae.orbit("archive", "throttle", "--storage", sid.hex(), "--max-roots-per-second", str(rate))
        ae.worker("thr1", [vol])
        ae.worker("thr2", [vol])
        report = ae.tick()
        jobs = [ae.job(bytes.fromhex(n), bytes.fromhex(j)) for n, _k, j in report.jobs_created]
        assert len(jobs) == 2

        def roots() -> tuple[list[int], datetime]:
            """The confirmed roots of both jobs and the database clock, of one statement."""
            with platform_engine.connect() as conn:
                rows = conn.execute(
                    select(J.c.id, J.c.roots, DB_CLOCK.sql().label("now")).where(
                        J.c.id.in_([j.id for j in jobs])
                    )
                ).all()
            by_id = {bytes(r.id): int(r.roots) for r in rows}
            return [by_id[j.id] for j in jobs], rows[0].now

        wait_for(lambda: all(r > 0 for r in roots()[0]), 60, "both jobs under way", step=0.2)
        first, t0 = roots()
        t1 = t0
        while (t1 - t0).total_seconds() < window:
            time.sleep(2)
            ae.tick()  # as beat would: a job waiting for the budget is woken up again
            last, t1 = roots()
        measured = (sum(last) - sum(first)) / (t1 - t0).total_seconds()
        print(f"throttle {rate} roots/s, two workers: measured {measured:.1f} roots/s")
        assert measured <= rate * 1.10, (measured, first, last)
        assert measured >= rate * 0.5, (measured, first, last)
        assert all(b > a for a, b in zip(first, last, strict=True)), (first, last)
        states = {ae.job(j.namespace_id, j.id).state for j in jobs}
        assert JobState.FAILED not in states


def test_a_throttled_job_joins_the_budget_queue_instead_of_starving(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """In-process runner on MariaDB while another taker (as a second job's worker would) keeps
    the storage's budget busy, taking its turn again the moment it is paid for: the job waiting
    to be claimed reserves its own turn instead of only looking, so it is claimed within the
    first half of its slice and goes on sharing the rate -- it is never left WAITING with no
    wake-up but the next tick (the failure CI saw: both jobs' wake-ups taken, one job waited
    for the tick, which never came within the minute)."""
    from orbit_tasks.archive.controls import Scope
    from orbit_tasks.archive.engine import runner
    from orbit_tasks.archive.store import controls as control_store

    rate = 100
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="thr-queue",
            volume=tmp_path / "vol",
            kind="events",
            roots=300,
            batch_size=10,
        ).parts
        job = create_job(ae, ns, "events")
        ae.orbit("archive", "throttle", "--storage", sid.hex(), "--max-roots-per-second", str(rate))
        key = Scope(storage_id=sid).key
        stop = threading.Event()
        taken: list[int] = []

        def other_taker() -> None:
            with platform_engine.connect() as conn:
                while not stop.is_set():
                    wait = control_store.take_budget(conn, key, 10, rate)
                    taken.append(10)
                    time.sleep(wait)

        t = threading.Thread(target=other_taker, daemon=True)
        t.start()
        try:
            time.sleep(0.5)  # the other taker holds the budget's turn
            started = time.monotonic()
            outcome = runner.run_job(
                ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings, engine=platform_engine,
                publish=lambda *a, **k: None,
            )  # fmt: skip
            elapsed = time.monotonic() - started
        finally:
            stop.set()
            t.join(5)
        j = ae.job(ns, job.id)
        assert outcome != "waiting", (outcome, elapsed, j)
        assert j.batches > 1 and j.attempts == j.batches + (
            0 if j.state is JobState.SUCCEEDED else 1
        ), j
        assert taken, "the other taker never ran"


def test_window_boundaries_before_a_claim_and_at_a_batch_boundary(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """In-process runner on MariaDB with a fixed clock: the window 01:00-06:00 is closed at
    06:00:00.000000 exactly (no claim: attempts flat, the wait recorded) and open at 01:00
    exactly; a claim started at 05:59:59.5 stops at the batch boundary where the estimated
    database time passes 06:00 and releases with its file confirmed (attempts == batches + 1
    throughout)."""
    from orbit_tasks.archive.engine import runner
    from orbit_tasks.db.engine import FixedClock

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="win-exact",
            volume=tmp_path / "vol",
            kind="events",
            roots=4000,
            batch_size=5,
        ).parts
        job = create_job(ae, ns, "events")
        ae.orbit("archive", "window", "--storage", sid.hex(), "01:00-06:00")
        day = job.created_at.replace(hour=0, minute=0, second=0, microsecond=0)
        clock = FixedClock(day + timedelta(hours=6))
        settings = ae.settings.with_overrides(archive_slice_seconds=10)

        def run() -> str:
            return runner.run_job(
                ns.hex(), job.id.hex(), {sid.hex(): vol}, settings, engine=platform_engine,
                publish=lambda *a, **k: None, clock=clock,
            )  # fmt: skip

        assert run() == "waiting"
        j = ae.job(ns, job.id)
        assert (j.state, j.attempts) == (JobState.PENDING, 0)
        clock.set(day + timedelta(hours=6, seconds=-0.5))
        assert run() == "stopped"
        j = ae.job(ns, job.id)
        assert j.state is JobState.PENDING and 0 < j.batches < 800, j
        assert j.attempts == j.batches + 1
        clock.set(day + timedelta(hours=12))
        assert run() == "waiting"
        assert ae.job(ns, job.id).attempts == j.attempts
        clock.set(day + timedelta(days=1, hours=1))  # the start is inside
        outcomes = [run() for _ in range(3)]
        assert "succeeded" in outcomes, outcomes
        done = ae.job(ns, job.id)
        assert done.attempts == done.batches + 1
        assert_succeeded_exactly(ae, done, vol)
        st = _show(ae, done)["statistics"]
        assert st["waiting"] is None and st["waited_seconds"]["window"] > 0, st


def test_jobs_outside_their_window_do_not_take_the_sweeps_wake_ups_from_others(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """The sweep wakes the oldest PENDING jobs first, and a job waiting before its claim keeps
    its place (nothing of the job row moves). Jobs of a namespace whose window is closed would
    take the whole wake-up budget every tick and the other namespaces' jobs on the storage
    would never be woken: the tick leaves jobs outside a window out of its sweep, as it does
    for paused scopes, and wakes them at the first tick inside it."""
    from orbit_tasks.db.engine import FixedClock

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        sid = make_volume(platform_engine, tmp_path / "vol")
        ns_w, _ = make_namespace(platform_engine, "win-closed")
        ns_o, _ = make_namespace(platform_engine, "win-other")
        make_plan(platform_engine, ns_w, "events", sid)
        job_w = create_job(ae, ns_w, "events")  # the older job
        make_plan(platform_engine, ns_o, "events", sid)
        job_o = create_job(ae, ns_o, "events")
        with platform_engine.connect() as conn:
            now = db_now(conn)
        start = (now + timedelta(hours=2)).strftime("%H:%M")
        end = (now + timedelta(hours=3)).strftime("%H:%M")
        ae.orbit("archive", "window", "--namespace", "win-closed", f"{start}-{end}")
        woken: list[bytes] = []
        one = ae.settings.with_overrides(archive_wakeups_per_tick=1)

        def tick(clock: object = None) -> None:
            from orbit_tasks.archive.tick import run_tick

            woken.clear()
            kw = {} if clock is None else {"clock": clock}
            run_tick(platform_engine, one, lambda s, n, j, kind="": woken.append(j), **kw)

        for _ in range(3):
            tick()
            assert woken == [job_o.id], (woken, job_w.id, job_o.id)
        tick(FixedClock(now + timedelta(hours=2, minutes=1)))  # open: the older job is woken
        assert woken == [job_w.id], woken


def test_a_throttled_stop_wakes_a_continuation_that_takes_its_turn(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """In-process runner on MariaDB: each batch costs 3 s of a 10 roots/s budget, so the claim
    sleeps its turns within its 14 s slice and stops `throttled` at the boundary whose turn
    ends after the slice, publishing a continuation. That continuation arrives at once and
    sees the rest of that turn plus the cost of the file the stop confirmed (up to 6 s, more
    than the old 5 s cap, less than half the slice): it must take its turn and claim, not
    record a wait whose only wake-up is the next tick (a minute away in production), which
    would pace the scope far below its rate."""
    from orbit_tasks.archive.engine import runner

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="thr-cont",
            volume=tmp_path / "vol",
            kind="events",
            roots=600,
            batch_size=30,
        ).parts
        job = create_job(ae, ns, "events")
        ae.orbit("archive", "throttle", "--storage", sid.hex(), "--max-roots-per-second", "10")
        settings = ae.settings.with_overrides(archive_slice_seconds=14)
        published: list[bytes] = []

        def run() -> str:
            return runner.run_job(
                ns.hex(), job.id.hex(), {sid.hex(): vol}, settings, engine=platform_engine,
                publish=lambda s, n, j, kind="": published.append(j),
            )  # fmt: skip

        assert run() == "stopped"
        assert published == [job.id]  # the continuation of a throttled stop
        first = ae.job(ns, job.id)
        assert first.state is JobState.PENDING and first.attempts == first.batches + 1
        outcome = run()  # the continuation, delivered at once
        assert outcome in ("stopped", "released", "succeeded"), outcome
        j = ae.job(ns, job.id)
        assert j.batches > first.batches and j.attempts == j.batches + (
            0 if j.state is JobState.SUCCEEDED else 1
        ), (first, j)


def test_a_pause_while_a_job_sleeps_its_throttle_turn_keeps_it_unclaimed(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """In-process runner on MariaDB: the storage's budget is taken 4 s ahead, so the job
    reserves its turn and sleeps it before claiming. A pause committed during that sleep is
    seen before the claim: the job waits `paused`, unclaimed (attempts 0, no batch), instead
    of being claimed after the pause and writing a batch before its first boundary says so."""
    from orbit_tasks.archive.controls import ControlKind, Scope
    from orbit_tasks.archive.store import controls as control_store

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="thr-pause",
            volume=tmp_path / "vol",
            kind="events",
            roots=100,
            batch_size=10,
        ).parts
        job = create_job(ae, ns, "events")
        ae.orbit("archive", "throttle", "--storage", sid.hex(), "--max-roots-per-second", "10")
        settings = ae.settings.with_overrides(archive_slice_seconds=14)
        with platform_engine.connect() as conn:
            control_store.take_budget(conn, Scope(storage_id=sid).key, 40, 10)  # 4 s ahead
        delivery = deliver_in_thread(job, {sid.hex(): vol}, settings, engine=platform_engine)
        time.sleep(1.5)  # the job sleeps its turn, holding no claim
        with platform_engine.begin() as conn:
            control_store.change(
                conn, control_store.Change(ControlKind.PAUSE, Scope(), reason="now"), actor="t"
            )
        outcome = delivery.join(30)
        j = ae.job(ns, job.id)
        assert outcome == ["waiting"], (outcome, j)
        assert (j.state, j.attempts, j.batches) == (JobState.PENDING, 0, 0), j
        assert _show(ae, j)["statistics"]["waiting"] == "paused"
