"""Archive -> restore round trip (issue 10): history of every kind, archived by a real
``orbit worker archive``, restored with the real ``orbit job restore`` into an empty MariaDB
database, an ``orbit db upgrade``'d one and a SQLite file, and compared with the source row by
row, column by column (value and type). Restoring again changes nothing."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert

from orbit_tasks.archive.engine.volume import job_dir
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import source
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.history_tables import task_attempts, tasks
from orbit_tasks.ids import new_id
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
from tests.support.cli import orbit_env, run_orbit
from tests.support.db import mariadb_database, migrated_engine
from tests.support.restore import (
    assert_rows_identical,
    column_shapes,
    reflected_rows,
    source_rows,
    sqlite_raw,
)

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]

ODD_JSON = '{"amount":1.10,"big":12345678901234567890.000,"huge":1E+400,"s":"😀 \\u00e9 𝄞"}'


def _odd_task(engine: Engine, ns: bytes, queue: bytes) -> bytes:
    """A root with the edge cases: NULLs everywhere they are allowed, exact decimals that no
    float holds, 4-byte UTF-8 in VARCHAR and JSON text, a trailing space, microsecond 1, no
    children (an empty child list)."""
    rid = new_id()
    with engine.begin() as conn:
        now = db_now(conn)
        conn.execute(
            insert(tasks).values(
                namespace_id=ns, id=rid, queue_id=queue, state="DONE😀", idempotency_key=None,
                request_json=ODD_JSON, result_json=None, error_code="E ", attempts=0,
                created_at=now - timedelta(hours=3), started_at=None,
                finished_at=(now - timedelta(hours=2)).replace(microsecond=1),
            )
        )  # fmt: skip
    return rid


def _job_rows(engine: Engine, job: Job) -> dict[str, list[dict[str, Any]]]:
    hk = HISTORY_KINDS[job.kind]
    with engine.connect() as conn:
        rng = job_store.job_range(conn, job)
        ids = source.root_keys_in_range(conn, job.kind, job.namespace_id, rng)
    out = {hk.root.name: source_rows(engine, hk.root, job.namespace_id, ids)}
    for c in hk.children:
        out[c.table.name] = source_rows(engine, c.table, job.namespace_id, ids, c.parent_column)
    return out


def _assert_target_holds(target_url: str, expected: dict[str, list[dict[str, Any]]]) -> None:
    target = make_engine(target_url)
    try:
        for table, rows in expected.items():
            assert_rows_identical(rows, reflected_rows(target, table), table)
    finally:
        target.dispose()


def _restore(env: dict[str, str], job: Job, volume: Path, into: str) -> dict[str, Any]:
    args = ["job", "restore", job.namespace_id.hex(), job.id.hex(), "--volume", str(volume)]
    proc = run_orbit([*args, "--into", into, "--json"], env)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [ln["event"] for ln in lines] == ["batch"] * job.batches + ["summary"]
    assert [ln["seq"] for ln in lines[:-1]] == list(range(1, job.batches + 1))
    return lines[-1]


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
        odd = _odd_task(platform_engine, ns, queue)
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
            expected = _job_rows(platform_engine, job)
            assert all(expected.values()), kind  # roots, and children where the kind has them
            if kind == "tasks":
                assert odd in [r["id"] for r in expected["orbit_tasks"]]
            with mariadb_database("orbit_r") as empty:
                summary = _restore(env, job, vol, empty)
                assert summary["ok"] and summary["conflicts"] == []
                assert summary["inserted"] == {t: len(r) for t, r in expected.items() if r}
                _assert_target_holds(empty, expected)
                made = make_engine(empty)
                for table in expected:  # the tables made from the manifest are the source's
                    shape = column_shapes(made, table)
                    assert shape and shape == column_shapes(platform_engine, table), table
                made.dispose()
                again = _restore(env, job, vol, empty)  # twice: nothing changes, exit 0
                assert again["inserted"] == {}
                assert again["skipped"] == summary["inserted"]
                _assert_target_holds(empty, expected)
            sqlite_url = f"sqlite:///{tmp_path / f'{kind}.sqlite3'}"
            _restore(env, job, vol, sqlite_url)
            _assert_target_holds(sqlite_url, expected)

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
                _restore(env, jobs[kind], vol, upgraded_url)
                _assert_target_holds(upgraded_url, _job_rows(platform_engine, jobs[kind]))


def test_restored_children_keep_their_order_and_nulls(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """In-process archive (no worker): the child table with NULL columns (finished_at of
    attempts, status_code of delivery attempts) comes back exactly, also into SQLite."""
    from orbit_tasks.archive.engine import runner

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, queue = make_namespace(platform_engine, "nulls")
        vol = tmp_path / "vol"
        sid = make_volume(platform_engine, vol)
        make_plan(platform_engine, ns, "deliveries", sid, batch_size=3)
        seed(platform_engine, ns, queue, "deliveries", 20, seed=7)
        job_hex = next(j for _, k, j in ae.tick().jobs_created if k == "deliveries")
        out = None
        while out in (None, "released"):
            out = runner.run_job(ns.hex(), job_hex, {sid.hex(): vol}, ae.settings,
                                 engine=platform_engine, publish=lambda *a, **k: None)  # fmt: skip
        job = ae.job(ns, bytes.fromhex(job_hex))
        expected = _job_rows(platform_engine, job)
        nulls = [r for r in expected["orbit_delivery_attempts"] if r["status_code"] is None]
        assert nulls, "the generator gives TIMEOUT attempts without a status code"
        sqlite_url = f"sqlite:///{tmp_path / 'd.sqlite3'}"
        _restore(orbit_env(mariadb_url), job, vol, sqlite_url)
        _assert_target_holds(sqlite_url, expected)
    assert task_attempts.name == "orbit_task_attempts"
