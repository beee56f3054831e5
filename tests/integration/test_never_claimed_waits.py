"""Waits of jobs that were never claimed (issue 27, docs/archive-controls.md "Ticks and wake-ups"):
real MariaDB, Redis, an `orbit worker archive` process, the exporter and the real CLI.

A job created while its scope is paused or outside its run window gets no wake-up, so no worker
asks about it (a job that waits is never claimed to find that out): the tick records its wait.
`job show` and `job list` name the reason, `orbit_archive_jobs_waiting` counts it, the waited
time is counted from when the job became PENDING or the control began to hold it, whichever is
later (before: `waiting -`, the gauge 0, nothing counted).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.db.engine import FixedClock, db_now
from orbit_tasks.timestamps import format_ts
from tests.support.archive_jobs import (
    ArchiveEnv,
    archive_env,
    assert_succeeded_exactly,
    cli_json,
    create_job,
    make_namespace,
    make_plan,
    make_volume,
    wait_state,
)
from tests.support.metrics import running_exporter, value
from tests.support.scene import archive_scene, no_publish

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]


def _stats(ae: ArchiveEnv, ns: bytes, job_id: bytes) -> dict:
    shown = cli_json(ae.orbit("job", "show", ns.hex(), job_id.hex(), "--json"))
    return shown["statistics"]


def test_a_job_created_while_paused_shows_its_wait_is_gauged_and_counted(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, _q, vol, sid = archive_scene(
            platform_engine, name="born-paused", volume=tmp_path / "vol", kind="events",
            roots=40, batch_size=10,
        ).parts  # fmt: skip
        ae.worker("paused", [vol])
        ae.orbit("archive", "pause", "--storage", sid.hex(), "--reason", "disk swap")
        report = ae.tick()  # creates the job while the storage is paused: no wake-up
        ((_ns, _k, job_hex),) = report.jobs_created
        job_id = bytes.fromhex(job_hex)
        assert report.wakeups_published == 0 and report.waits_recorded == 1, report
        job = ae.job(ns, job_id)
        assert (job.state, job.attempts) == (JobState.PENDING, 0)

        with platform_engine.connect() as conn:  # read before `job show` reads its now
            held_for = (db_now(conn) - job.created_at).total_seconds()
        st = _stats(ae, ns, job_id)
        assert st["waiting"] == "paused", st
        assert st["waiting_since"] == format_ts(job.created_at), (st, job.created_at)
        assert st["waited_seconds"]["paused"] >= held_for > 0, (st, held_for)
        text_show = ae.orbit("job", "show", ns.hex(), job_hex).stdout
        assert "waiting" in text_show and "paused (since" in text_show, text_show

        listed = cli_json(ae.orbit("job", "list", ns.hex(), "--json"))["items"]
        assert [(i["id"], i["waiting"]) for i in listed] == [(job_hex, "paused")]
        table = ae.orbit("job", "list", ns.hex()).stdout.splitlines()
        assert table[0].split()[-1] == "WAITING" and table[1].split()[-1] == "paused", table

        exp_env = {k: v for k, v in ae.env.items() if k != "ORBIT_SENDER_DATABASE_URL"}
        exp_env.update(ORBIT_METRICS_CACHE_SECONDS="1", ORBIT_ARCHIVE_PAUSE_ALERT_AFTER="2h")
        with running_exporter(exp_env, tmp_path) as exporter:
            s = exporter.scrape()
            assert value(s, "orbit_archive_jobs_waiting", storage=sid.hex(), reason="paused") == 1
            # what OrbitArchivePauseForgotten compares: the pause's age and the alert age
            age = value(s, "orbit_archive_pause_age_seconds", scope=f"{sid.hex()}/*/*")
            assert age is not None and 0 < age < 600, age
            assert value(s, "orbit_archive_pause_alert_after_seconds") == 7200

        again = ae.tick()  # recorded once: the next tick writes nothing and keeps the start
        assert (again.waits_recorded, again.wakeups_published) == (0, 0), again
        assert _stats(ae, ns, job_id)["waiting_since"] == st["waiting_since"]

        ae.orbit("archive", "resume", "--storage", sid.hex())
        assert ae.tick().wakeups_published == 1
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
        assert done.state is JobState.SUCCEEDED, done
        assert done.attempts == done.batches + 1  # never claimed to find out it waits
        assert_succeeded_exactly(ae, done, vol)
        st = _stats(ae, ns, job_id)
        assert st["waiting"] is None and st["waited_seconds"]["paused"] >= held_for, st
        listed = cli_json(ae.orbit("job", "list", ns.hex(), "--json"))["items"]
        assert listed[0]["waiting"] is None


def test_a_pending_job_paused_later_waits_from_the_pause(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """A job created before a namespace's pause whose wake-up found no worker (none running):
    its wait starts at the pause's `since`, not at its creation; a job of another namespace on
    the storage is not held."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        sid = make_volume(platform_engine, tmp_path / "vol")
        ns_p, _ = make_namespace(platform_engine, "paused-later")
        ns_o, _ = make_namespace(platform_engine, "other-ns")
        for ns in (ns_p, ns_o):
            make_plan(platform_engine, ns, "events", sid)
        job_p = create_job(ae, ns_p, "events")  # both created by this tick, neither claimed
        job_o = ae.jobs(ns_o)[0]
        ae.orbit("archive", "pause", "--namespace", "paused-later", "--reason", "tenant move")
        (pause,) = cli_json(ae.orbit("archive", "controls", "--json"))["items"]
        assert ae.tick().waits_recorded == 1
        st = _stats(ae, ns_p, job_p.id)
        assert (st["waiting"], st["waiting_since"]) == ("paused", pause["since"]), (st, pause)
        assert st["waiting_since"] > format_ts(job_p.created_at)
        assert _stats(ae, ns_o, job_o.id)["waiting"] is None


def test_a_job_whose_window_closed_before_any_claim_waits_from_the_windows_end(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Created inside its namespace's window, never claimed (no worker), then the window closes:
    the tick standing after the window's end (the clock seam) records the wait `window` from the
    end of the window exactly; one standing inside it records nothing."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        sid = make_volume(platform_engine, tmp_path / "vol")
        ns, _ = make_namespace(platform_engine, "win-ns")
        make_plan(platform_engine, ns, "events", sid)
        with platform_engine.connect() as conn:
            now = db_now(conn)
        start, end = now - timedelta(hours=1), now + timedelta(hours=1)
        window = f"{start:%H:%M}-{end:%H:%M}"
        ae.orbit("archive", "window", "--namespace", "win-ns", window)
        report = run_tick(platform_engine, ae.settings, no_publish, clock=FixedClock(now))
        ((_ns, _k, job_hex),) = report.jobs_created
        assert report.waits_recorded == 0  # inside the window: nothing holds it
        assert _stats(ae, ns, bytes.fromhex(job_hex))["waiting"] is None

        after = FixedClock(now + timedelta(hours=1, minutes=5))
        report = run_tick(platform_engine, ae.settings, no_publish, clock=after)
        assert (report.waits_recorded, report.wakeups_published) == (1, 0), report
        st = _stats(ae, ns, bytes.fromhex(job_hex))
        closed_at = end.replace(second=0, microsecond=0)
        assert (st["waiting"], st["waiting_since"]) == ("window", format_ts(closed_at)), st


def test_explain_the_held_jobs_query_walks_the_claim_index(platform_engine: Engine) -> None:
    """The tick's read of held jobs without their wait (every tick while a pause or a closed
    window is in force): the jobs on ``ix_archive_job_claim`` in its order (no filesort), each
    joined to its open wait by the waits' primary key."""
    from sqlalchemy import insert

    from orbit_tasks.archive.controls import Scope, WaitReason
    from orbit_tasks.archive.store import controls as control_store
    from orbit_tasks.db.platform_tables import archive_jobs, job_waits
    from orbit_tasks.ids import new_id

    storages = [new_id() for _ in range(4)]
    namespaces = [new_id() for _ in range(8)]
    with platform_engine.begin() as conn:
        now = db_now(conn)
        jobs = [
            dict(
                namespace_id=namespaces[i % 8], id=new_id(), kind="events", plan_revision=1,
                policy_revision=1, storage_id=storages[i % 4], batch_size=10, max_bytes=1 << 20,
                state="PENDING" if i % 3 else "SUCCEEDED", created_at=now, updated_at=now,
            )
            for i in range(400)
        ]  # fmt: skip
        conn.execute(insert(archive_jobs), jobs)
        conn.execute(
            insert(job_waits),
            [
                dict(namespace_id=j["namespace_id"], job_id=j["id"], reason="paused", since=now,
                     waited_us=0, updated_at=now)
                for j in jobs[::5]
            ],
        )  # fmt: skip
        conn.execute(text("ANALYZE TABLE orbit_archive_jobs, orbit_archive_job_waits"))

    def explain(scopes: list[Scope]) -> dict[str, dict]:
        where = control_store.held_where(storages[0], scopes)
        query = control_store.unrecorded_held_query(storages[0], where, WaitReason.PAUSED, 1000)
        with platform_engine.connect() as conn:
            compiled = query.compile(dialect=conn.dialect)
            params = compiled.construct_params()
            args = tuple(params[k] for k in compiled.positiontup)
            rows = conn.exec_driver_sql("EXPLAIN " + compiled.string, args).mappings().all()
        return {str(r["table"]): dict(r) for r in rows}

    paused_storage = explain([Scope(storage_id=storages[0])])
    jobs, waits = paused_storage["orbit_archive_jobs"], paused_storage["orbit_archive_job_waits"]
    assert jobs["key"] == "ix_archive_job_claim", paused_storage
    assert "filesort" not in str(jobs["Extra"]), paused_storage
    assert waits["key"] == "PRIMARY", paused_storage
    # a paused namespace: the optimizer may read that namespace's jobs by the primary key
    # instead (a small set, sorted), never the whole table
    paused_ns = explain([Scope(namespace_id=namespaces[0])])
    jobs, waits = paused_ns["orbit_archive_jobs"], paused_ns["orbit_archive_job_waits"]
    assert jobs["type"] == "ref" and jobs["key"] in ("ix_archive_job_claim", "PRIMARY"), paused_ns
    assert waits["key"] == "PRIMARY", paused_ns
