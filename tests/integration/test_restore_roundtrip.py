"""Archive -> restore round trip (issue 10): history of every kind, archived by a real
``orbit worker archive``, restored with the real ``orbit job restore`` into an empty MariaDB
database, an ``orbit db upgrade``'d one and a SQLite file, and compared with the source row by
row, column by column (value and type). Restoring again changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine

from orbit_tasks.archive.engine.volume import job_dir
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.history_tables import task_attempts
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.archive_jobs import (
    archive_env,
    assert_succeeded_exactly,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_state,
)
from tests.support.cli import orbit_env
from tests.support.db import mariadb_database, migrated_engine
from tests.support.restore import (
    ODD_JSON,
    assert_target_holds,
    column_shapes,
    job_rows,
    odd_task,
    restore_job,
    sqlite_raw,
)
from tests.support.scene import archive_scene

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]


@pytest.mark.slow
def test_every_kind_round_trips_exactly(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, queue = make_namespace(platform_engine, "restore-ns")
        vol = tmp_path / "vol"
        sid = make_volume(platform_engine, vol)
        for i, kind in enumerate(HISTORY_KINDS):
            make_plan(platform_engine, ns, kind, sid, batch_size=7)
            seed(platform_engine, ns, queue, kind, 24, seed=40 + i)
        odd = odd_task(platform_engine, ns, queue)
        ae.worker("a", [vol])
        created = ae.tick().jobs_created
        assert len(created) == len(HISTORY_KINDS)
        jobs = {}
        for _, kind, job_hex in created:
            j = wait_state(
                ae, ae.job(ns, bytes.fromhex(job_hex)), {JobState.SUCCEEDED, JobState.FAILED}
            )
            assert j.state is JobState.SUCCEEDED, j
            assert_succeeded_exactly(ae, j, vol)
            jobs[kind] = j
        env = orbit_env(mariadb_url)

        for kind, job in jobs.items():
            manifest = next(job_dir(vol, ns, job.id).glob("00000000-*.json"))
            doc = json.loads(manifest.read_bytes())
            assert doc["format"] == "orbit-archive/2" and doc["source"]["columns"], kind
            expected = job_rows(platform_engine, job)
            assert all(expected.values()), kind  # roots, and children where the kind has them
            if kind == "tasks":
                assert odd in [r["id"] for r in expected["orbit_tasks"]]
            with mariadb_database("orbit_r") as empty:
                summary = restore_job(env, job, vol, empty)
                assert summary["ok"] and summary["conflicts"] == []
                assert summary["inserted"] == {t: len(r) for t, r in expected.items() if r}
                assert_target_holds(empty, expected)
                made = make_engine(empty)
                for table in expected:  # the tables made from the manifest are the source's
                    shape = column_shapes(made, table)
                    assert shape and shape == column_shapes(platform_engine, table), table
                made.dispose()
                again = restore_job(env, job, vol, empty)  # twice: nothing changes, exit 0
                assert again["inserted"] == {}
                assert again["skipped"] == summary["inserted"]
                assert_target_holds(empty, expected)
            sqlite_url = f"sqlite:///{tmp_path / f'{kind}.sqlite3'}"
            restore_job(env, job, vol, sqlite_url)
            assert_target_holds(sqlite_url, expected)

        # what an analyst sees in the SQLite file without SQLAlchemy: text and blobs as stored
        raw = sqlite_raw(
            tmp_path / "tasks.sqlite3",
            "SELECT request_json, hex(id), finished_at, result_json, error_code, state "
            f"FROM orbit_tasks WHERE id = x'{odd.hex()}'",
        )
        assert raw[0][0] == ODD_JSON and raw[0][1].lower() == odd.hex()
        assert raw[0][2].endswith(".000001") and raw[0][3] is None
        assert raw[0][4:] == ("E ", "DONE😀")

        # a target prepared by `orbit db upgrade` (the platform's own table definitions)
        with mariadb_database("orbit_u") as upgraded_url:
            with migrated_engine(upgraded_url, "platform"):
                pass
            for kind in ("tasks", "workflows"):
                restore_job(env, jobs[kind], vol, upgraded_url)
                assert_target_holds(upgraded_url, job_rows(platform_engine, jobs[kind]))


def test_restored_children_keep_their_order_and_nulls(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """In-process archive (no worker): the child table with NULL columns (finished_at of
    attempts, status_code of delivery attempts) comes back exactly, also into SQLite."""
    from orbit_tasks.archive.engine import runner

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, queue, vol, sid = archive_scene(
            platform_engine, name="nulls", volume=tmp_path / "vol", kind="deliveries",
            roots=20, batch_size=3, history_seed=7,
        ).parts  # fmt: skip
        job_hex = next(j for _, k, j in ae.tick().jobs_created if k == "deliveries")
        out = None
        while out in (None, "released"):
            out = runner.run_job(ns.hex(), job_hex, {sid.hex(): vol}, ae.settings,
                                 engine=platform_engine, publish=lambda *a, **k: None)  # fmt: skip
        job = ae.job(ns, bytes.fromhex(job_hex))
        expected = job_rows(platform_engine, job)
        nulls = [r for r in expected["orbit_delivery_attempts"] if r["status_code"] is None]
        assert nulls, "the generator gives TIMEOUT attempts without a status code"
        sqlite_url = f"sqlite:///{tmp_path / 'd.sqlite3'}"
        restore_job(orbit_env(mariadb_url), job, vol, sqlite_url)
        assert_target_holds(sqlite_url, expected)
    assert task_attempts.name == "orbit_task_attempts"
