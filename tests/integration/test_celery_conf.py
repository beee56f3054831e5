"""``celery inspect conf`` against a real worker shows Celery settings only (issue 9 item 6):
``celeryconfig.py`` exposes no imported helper (``timedelta``, ``Path``, ``get_settings``,
``annotations``, ...) as if it were a setting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery.app.defaults import DEFAULTS

from tests.support.cli import ORBIT, REPO
from tests.support.db import redis_url

pytestmark = pytest.mark.redis

BROKER = redis_url(6)
# Added by Celery itself to every configuration it reports.
CELERY_OWN_KEYS = {"deprecated_settings"}


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(
        CELERY_BROKER_URL=BROKER,
        ORBIT_VAR_DIR=str(tmp_path / "var"),
        ORBIT_DATABASE_URL=f"sqlite:///{tmp_path / 'platform.sqlite3'}",
    )
    node = f"conf-{os.getpid()}@test"
    log = tmp_path / "worker.log"
    redis.Redis.from_url(BROKER).flushdb()
    # workers refuse a missing schema (SPEC §12)
    subprocess.run(
        [str(ORBIT), "db", "upgrade"], cwd=REPO, env=env, check=True, capture_output=True
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(ORBIT), "worker", "control", "-n", node, "--", "--without-mingle"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "ready." not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "worker not ready"
            time.sleep(0.2)
        yield node, env
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        redis.Redis.from_url(BROKER).flushdb()


def test_inspect_conf_shows_only_celery_settings(worker: tuple[str, dict[str, str]]) -> None:
    node, env = worker
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "orbit_tasks.celery_app", "inspect", "conf"]
        + ["-d", node, "--json", "--timeout", "10"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    conf = json.loads(proc.stdout)[node]
    assert conf["task_default_queue"] == "orbit.control"  # the worker really answered
    assert conf["worker_prefetch_multiplier"] == 1 and conf["task_ignore_result"] is True
    unknown = sorted(set(conf) - set(DEFAULTS) - CELERY_OWN_KEYS)
    assert unknown == [], f"celeryconfig exposes non-settings: {unknown}"
