"""``ORBIT_LOG_FORMAT=json`` in real processes (SPEC §12 "Logs"): an archive worker (main process
and pool child), the reference API (uvicorn's loggers too), a sender worker and beat. Every line
each one writes (stdout and stderr together, as a container runtime collects them) parses as one
JSON object with ``ts``/``level``/``logger``; action records carry ``action``; no token, password
or request body appears."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from celery import Celery
from sqlalchemy import Engine

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.platform import store as platform_store
from tests.support.api_server import running_api_server
from tests.support.archive_jobs import (
    archive_env,
    wait_for,
)
from tests.support.db import mariadb_database, migrated_engine
from tests.support.processes import ORBIT, started
from tests.support.scene import archive_scene
from tests.support.sender import REDIS_URL, celery_env, enqueue_many, open_count

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def json_lines(text: str, where: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object with ts/level/logger (asserts it)."""
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"{where} line {number} is not JSON: {line!r}") from None
        assert isinstance(obj, dict), (where, number, line)
        assert TS.match(obj.get("ts", "")), (where, number, line)
        assert obj.get("level") in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}, line
        assert isinstance(obj.get("logger"), str) and obj["logger"], line
        assert ("action" in obj) != ("message" in obj), line  # an action record or a message
        records.append(obj)
    assert records, f"{where} wrote nothing"
    return records


def actions(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if "action" in r:
            out.setdefault(r["action"], []).append(r)
    return out


def test_archive_worker_writes_one_json_object_per_line(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path, ORBIT_LOG_FORMAT="json") as ae:
        ns, queue, vol, sid = archive_scene(
            platform_engine, name="json-logs", volume=tmp_path / "vol", roots=10, batch_size=4
        ).parts
        node = f"jsonlog-{os.getpid()}@test"
        cmd = [ORBIT, "worker", "archive", "--volume", str(vol), "--no-control", "-c", "1"]
        cmd += ["-n", node, "--", "--without-mingle", "--without-gossip", "--without-heartbeat"]
        with started(cmd, ae.env, tmp_path / "worker.log") as worker:
            wait_for(lambda: "ready." in worker.text(), 60, "worker ready")
            report = run_tick(platform_engine, ae.settings, lambda *a, **k: None)
            ((_, kind, job_hex),) = report.jobs_created
            job_id = bytes.fromhex(job_hex)
            ae.publish(sid, ns, job_id, kind=kind)
            wait_for(
                lambda: ae.job(ns, job_id).state is JobState.SUCCEEDED, 90, "job SUCCEEDED", 0.3
            )
            wait_for(lambda: "archive.job.succeeded" in worker.text(), 30, "success logged")
            text = worker.text()
        records = json_lines(text, "archive worker")
        by_action = actions(records)
        (started_rec,) = by_action["worker.started"]
        assert started_rec["queues"] == [f"orbit.archive.{sid.hex()}"]
        assert started_rec["hostname"] == node
        # The pool child's records (the runner runs there) are JSON too, with their fields.
        (done,) = by_action["archive.job.succeeded"]
        assert done["job_id"] == job_hex and done["level"] == "INFO"
        assert done["logger"].startswith("orbit.")
        loggers = {r["logger"] for r in records}
        assert any(name.startswith("celery.") for name in loggers), loggers  # Celery's own
        assert any("ready." in r.get("message", "") for r in records)
        assert "-------------- " not in text  # no banner


def test_api_sender_worker_and_beat_log_json_without_secrets(tmp_path: Path) -> None:
    redis.Redis.from_url(REDIS_URL).flushdb()
    with (
        mariadb_database("orbit_jl") as platform_url,
        migrated_engine(platform_url, "platform") as platform,
        mariadb_database("orbit_jlb") as business_url,
        migrated_engine(business_url, "business") as business,
    ):
        with platform.begin() as conn:
            ns = platform_store.create_namespace(conn, "jsonlog-" + secrets.token_hex(3))
            q = platform_store.create_queue(conn, ns, "q0")
            _, token = platform_store.create_credential(conn, ns, None)
        ops = enqueue_many(business, ns.hex(), [q.hex()], 6)
        json_env = {"ORBIT_LOG_FORMAT": "json"}
        with running_api_server(platform_url, extra_env=json_env) as api:
            # The safety net in a real process: a token in a query string (uvicorn's access
            # log prints the path) and a bad bearer token.
            httpx.get(api.base_url + "/v1/credential", params={"token": token}, timeout=10)
            bad = httpx.get(
                api.base_url + "/v1/credential",
                headers={"Authorization": "Bearer orb_not-a-real-token-123"},
                timeout=10,
            )
            assert bad.status_code == 401
            env = celery_env(
                business_url,
                platform_url,
                api.base_url,
                token,
                ORBIT_SENDER_LEASE_SECONDS="30",
                ORBIT_SENDER_HTTP_TIMEOUT_SECONDS="5",
                ORBIT_SENDER_TICK_SECONDS="1",
                ORBIT_VAR_DIR=str(tmp_path / "var"),
                **json_env,
            )
            node = f"jsonsend-{os.getpid()}@test"
            sender_cmd = [ORBIT, "worker", "sender", "-c", "1", "-n", node, "--"]
            sender_cmd += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
            with (
                started(sender_cmd, env, tmp_path / "sender.log") as sender,
                started([ORBIT, "beat"], env, tmp_path / "beat.log") as beat,
            ):
                wait_for(lambda: open_count(business) == 0, 120, "rows relayed by beat's ticks")
                time.sleep(1.5)  # one more tick: beat's "Sending due task" lines keep coming
                sender_text, beat_text = sender.text(), beat.text()
            api_text = api.output()
        app = Celery("cleanup", broker=REDIS_URL)
        app.close()
    redis.Redis.from_url(REDIS_URL).flushdb()

    api_records = json_lines(api_text, "api")
    sender_records = json_lines(sender_text, "sender worker")
    beat_records = json_lines(beat_text, "beat")
    assert len(actions(api_records).get("api.task.accepted", [])) == len(ops)
    assert len(actions(sender_records).get("sender.row.accepted", [])) == len(ops)
    api_loggers = {r["logger"] for r in api_records}
    assert {"uvicorn.error", "uvicorn.access"} <= api_loggers, api_loggers
    assert any("Sending due task" in r.get("message", "") for r in beat_records)
    assert any(r["logger"].startswith("celery.beat") for r in beat_records)
    everything = "\n".join([api_text, sender_text, beat_text])
    assert token not in everything and token[4:] not in everything
    assert "orb_not-a-real-token-123" not in everything
    assert "token=<redacted>" in api_text  # the query string was logged, its value was not
    assert "😀" not in everything  # request bodies (with 4-byte characters) never logged


def test_pool_lines_of_a_task_killed_by_its_hard_time_limit_are_json(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Issue 14 item 6.6: the prefork pool's own lines (billiard's "multiprocessing" logger: the
    hard time limit's kill, "Process 'ForkPoolWorker-1' pid:N exited with 'signal 9 (SIGKILL)'")
    go through the one JSON formatter too. The task is stopped right after its claim (SIGSTOP:
    the soft limit cannot interrupt it), so only the hard limit ends it (lease 6 s: soft 4 s,
    hard 5 s)."""
    with archive_env(mariadb_url, platform_engine, tmp_path, ORBIT_LOG_FORMAT="json") as ae:
        ns, queue, vol, sid = archive_scene(
            platform_engine, name="json-limits", volume=tmp_path / "vol", roots=10, batch_size=4
        ).parts
        marker = tmp_path / "claimed"
        worker = ae.worker("limits", [vol], failpoints=f"archive.after_claim=stop:{marker}")
        report = run_tick(platform_engine, ae.settings, lambda *a, **k: None)
        ((_, kind, job_hex),) = report.jobs_created
        ae.publish(sid, ns, bytes.fromhex(job_hex), kind=kind)
        wait_for(marker.exists, 30, "job claimed")
        wait_for(lambda: "SIGKILL" in worker.text(), 30, "pool child killed")
        time.sleep(0.5)  # the pool's replacement child starts
        text = worker.text()
    records = json_lines(text, "archive worker")
    messages = [(r["logger"], r["level"], r.get("message", "")) for r in records]
    assert any("Hard time limit (5s) exceeded" in m for _, _, m in messages), messages
    exited = [(lg, lv) for lg, lv, m in messages if "exited with 'signal 9 (SIGKILL)'" in m]
    assert exited == [("multiprocessing", "ERROR")], messages
