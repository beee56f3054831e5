"""An ``orbit-archive/1`` job written by the code before format 2 (tests/fixtures) still
verifies, exports and restores exactly (real MariaDB, real files, the real CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine

from orbit_tasks.db.engine import make_engine
from tests.support.cli import orbit_env, run_orbit
from tests.support.db import mariadb_database
from tests.support.restore import (
    assert_rows_identical,
    fixture_rows,
    install_format1_fixture,
    reflected_rows,
)

pytestmark = [pytest.mark.mariadb]


def test_format1_fixture_verifies_exports_and_restores(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    ns, job, volume = install_format1_fixture(platform_engine, tmp_path)
    env = orbit_env(mariadb_url)
    manifest = next((volume / ns.hex() / job.hex()).glob("00000000-*.json"))
    assert json.loads(manifest.read_bytes())["format"] == "orbit-archive/1"

    verify = run_orbit(
        ["job", "verify", ns.hex(), job.hex(), "--volume", str(volume), "--json"], env
    )
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["ok"] is True
    export = run_orbit(["job", "export", ns.hex(), job.hex(), "--volume", str(volume)], env)
    assert export.returncode == 0, export.stderr
    expected = fixture_rows("source-rows.json")
    assert len(export.stdout.splitlines()) == len(expected["orbit_tasks"])

    with mariadb_database("orbit_r") as target_url:
        args = ["job", "restore", ns.hex(), job.hex(), "--volume", str(volume)]
        first = run_orbit([*args, "--into", target_url, "--json"], env)
        assert first.returncode == 0, first.stderr
        summary = json.loads(first.stdout.splitlines()[-1])
        assert summary["jobs"][0]["format"] == "orbit-archive/1"
        assert summary["inserted"] == {"orbit_tasks": 11, "orbit_task_attempts": 22}
        target = make_engine(target_url)
        try:
            for table in ("orbit_tasks", "orbit_task_attempts"):
                want = sorted(expected[table], key=lambda r: _pk(table, r))
                assert_rows_identical(want, reflected_rows(target, table), table)
        finally:
            target.dispose()

    sqlite_path = tmp_path / "analyst.sqlite3"
    into = f"sqlite:///{sqlite_path}"
    done = run_orbit([*args, "--into", into], env)
    assert done.returncode == 0, done.stderr
    target = make_engine(into)
    try:
        for table in ("orbit_tasks", "orbit_task_attempts"):
            want = sorted(expected[table], key=lambda r: _pk(table, r))
            assert_rows_identical(want, reflected_rows(target, table), table)
    finally:
        target.dispose()


def _pk(table: str, row: dict) -> tuple:
    if table == "orbit_tasks":
        return (row["namespace_id"], row["id"])
    return (row["namespace_id"], row["task_id"], row["attempt_no"])
