"""Workers, beat and the API check the schema at start (SPEC §12): against a missing or different
table they refuse in one line naming the table and the command that fixes it, and start nothing.
The sender's tables created by the application's own tool (no migration record of ours) pass
``orbit sender db check`` and carry a real relay through a real ``orbit worker sender``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine, inspect, text

from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.platform_tables import metadata as platform_metadata
from tests.support import sender as sender_support
from tests.support.api_server import free_port
from tests.support.cli import ORBIT, REPO, orbit_env, run_orbit
from tests.support.db import mariadb_database, migrated_engine, redis_url
from tests.support.schema import (
    create_b0002_tables,
    create_b0003_tables,
    load_app_sender_tables,
    load_seed,
)
from tests.support.sender import World, check_invariants, enqueue_many, open_count

# An empty platform database misses every platform table: the first by name, and the others.
OTHER_PLATFORM_TABLES = len(platform_metadata.tables) - 1

pytestmark = [pytest.mark.mariadb]

world = sender_support.world
REDIS_URL = redis_url(7)


def _refusal(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def empty_url() -> Iterator[str]:
    with mariadb_database("orbit_empty") as url:
        yield url


def test_processes_refuse_to_start_on_missing_tables(empty_url: str, tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    env = orbit_env(empty_url, empty_url, ORBIT_VAR_DIR=str(tmp_path / "var"))
    platform = "platform database: table orbit_archive_control_generation is missing "
    platform += f"(and {OTHER_PLATFORM_TABLES} more); run `orbit db upgrade`"
    business = "business database: table sender_holds is missing (and 4 more); "
    business += "run `orbit sender db upgrade`"
    cases = {
        ("worker", "archive", "--volume", str(volume)): platform,
        ("worker", "control"): platform,
        ("worker", "sender"): business,
        ("beat",): platform,  # beat checks both databases the environment names
        ("api", "serve", "--port", str(free_port())): platform,
    }
    for args, line in cases.items():
        started = time.monotonic()
        assert _refusal(run_orbit(args, env, timeout=60)) == f"error: {line}", args
        assert time.monotonic() - started < 30
    assert not (tmp_path / "var").exists()  # beat did not even create its schedule folder


def test_celery_started_directly_refuses_too(empty_url: str, tmp_path: Path) -> None:
    """A worker or beat started as ``celery -A orbit_tasks.celery_app ...`` (not through
    ``orbit``) gets the same check from the Celery signals: the databases its queues use (the
    default queue is orbit.control), the same one line and exit code, no traceback."""
    env = orbit_env(
        empty_url, empty_url, ORBIT_VAR_DIR=str(tmp_path / "var"), CELERY_BROKER_URL=REDIS_URL
    )
    platform = "error: platform database: table orbit_archive_control_generation is missing "
    platform += f"(and {OTHER_PLATFORM_TABLES} more); run `orbit db upgrade`"
    business = "error: business database: table sender_holds is missing (and 4 more); "
    business += "run `orbit sender db upgrade`"
    celery = [str(REPO / ".venv/bin/python"), "-m", "celery", "-A", "orbit_tasks.celery_app"]
    cases = {
        ("worker", "-Q", "orbit.archive." + "ab" * 16, "-P", "solo"): platform,
        ("worker", "-P", "solo"): platform,  # no -Q: the default queue, orbit.control
        ("worker", "-Q", "orbit.sender", "-P", "solo"): business,
        ("beat", "-s", str(tmp_path / "schedule")): platform,
    }
    for args, line in cases.items():
        proc = subprocess.run(
            [*celery, *args], env=env, capture_output=True, text=True, timeout=60, cwd=REPO
        )
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == line, (args, proc.stderr)
        assert "celery@" not in proc.stdout  # the worker never started (no banner)


def test_processes_refuse_a_table_that_differs(tmp_path: Path) -> None:
    with mariadb_database("orbit_alt") as url, migrated_engine(url, "platform") as engine:
        with engine.begin() as conn:
            conn.execute(
                text("ALTER TABLE orbit_archive_jobs MODIFY error_code VARCHAR(64) NOT NULL")
            )
        env = orbit_env(url, ORBIT_VAR_DIR=str(tmp_path / "var"))
        line = _refusal(run_orbit(["worker", "control"], env))
        assert line.startswith("error: platform database: table orbit_archive_jobs differs")
        assert "column error_code: type varchar(64), expected varchar(32)" in line
        assert "`orbit db check` lists every difference" in line
        assert _refusal(run_orbit(["api", "serve", "--port", str(free_port())], env)) == line


def test_beat_of_an_outbox_only_deployment_checks_the_business_database(tmp_path: Path) -> None:
    """An application runs beat for its outbox alone: no platform database to check."""
    with mariadb_database("orbit_app") as url:
        env = orbit_env("unused://", ORBIT_VAR_DIR=str(tmp_path / "var"))
        env.pop("ORBIT_DATABASE_URL")
        env["ORBIT_SENDER_DATABASE_URL"] = url
        line = _refusal(run_orbit(["beat", "--print-command"], env))
        assert "business database: table sender_holds is missing (and 4 more)" in line
        load_seed(url, "sender_outbox.sql")
        line = _refusal(run_orbit(["beat", "--print-command"], env))
        assert "business database: table sender_holds is missing (and 2 more)" in line
        create_b0002_tables(url)
        line = _refusal(run_orbit(["beat", "--print-command"], env))
        assert "business database: table sender_holds is missing" in line
        create_b0003_tables(url)
        ok = run_orbit(["beat", "--print-command"], env)
        assert ok.returncode == 0, ok.stderr


@pytest.fixture
def app_business() -> Iterator[tuple[str, Engine]]:
    """A business database whose sender tables the application's own tool created from the
    seed DDL and the DDL of revisions b0002 and b0003: no migration record of ours."""
    with mariadb_database("orbit_appdb") as url:
        load_app_sender_tables(url)
        engine = make_engine(url)
        try:
            yield url, engine
        finally:
            engine.dispose()


def test_sender_tables_of_the_application_tool_relay_through_a_real_worker(
    world: World, app_business: tuple[str, Engine], tmp_path: Path
) -> None:
    url, engine = app_business
    env = orbit_env(world.platform_url, url, ORBIT_VAR_DIR=str(tmp_path / "var"))
    check = run_orbit(["sender", "db", "check"], env)
    assert check.returncode == 0, check.stdout
    assert "no migration record of ours (tables verified by shape)" in check.stdout
    ops = enqueue_many(engine, world.ns, world.queues, 20)
    env.update(
        CELERY_BROKER_URL=REDIS_URL,
        ORBIT_API_URL=world.api.base_url,
        ORBIT_API_TOKEN=world.token,
        ORBIT_SENDER_LEASE_SECONDS="10",
    )
    redis.Redis.from_url(REDIS_URL).flushdb()
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [str(ORBIT), "worker", "sender", "-c", "1", "-n", f"app-{os.getpid()}@test", "--",
             "--without-mingle", "--without-gossip", "--without-heartbeat"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    app = Celery("schema-test-beat", broker=REDIS_URL)
    try:
        end = time.monotonic() + 90
        while open_count(engine) and time.monotonic() < end:
            assert worker.poll() is None, log.read_text(errors="replace")
            app.send_task("orbit.sender.tick", queue="orbit.sender", expires=5)
            time.sleep(0.5)
    finally:
        app.close()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        redis.Redis.from_url(REDIS_URL).flushdb()
    assert check_invariants(engine, world.platform, require_accepted=True) == {"ACCEPTED": len(ops)}
    assert "sender_alembic_version" not in inspect(engine).get_table_names()
