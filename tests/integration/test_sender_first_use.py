"""What an application developer meets first with the sender (issue 23, "first use"): a real
``orbit worker sender`` refuses to start without a usable credential and API, in one line naming
the variable (and the URL, its password hidden), exit 2, before any Celery process starts."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orbit_tasks.queues import CONTROL_QUEUE, SENDER_QUEUE
from orbit_tasks.sender.wakeup import MAX_WAITING_FILE_WAKEUPS
from tests.support import sender as sender_support
from tests.support.cli import orbit_env, run_orbit
from tests.support.db import migrated_engine
from tests.support.processes import ORBIT, started
from tests.support.sender import REDIS_URL, World

pytestmark = [pytest.mark.mariadb]

world = sender_support.world


@pytest.fixture
def env(world: World, tmp_path: Path) -> Iterator[dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'business.sqlite3'}"
    with migrated_engine(url, "business"):
        yield orbit_env(world.platform_url, url, ORBIT_VAR_DIR=str(tmp_path / "var"))


def _start(env: dict[str, str], **extra: str) -> tuple[int, str, str]:
    got = run_orbit(["worker", "sender", "-c", "1"], {**env, **extra}, timeout=60)
    return got.returncode, got.stdout, got.stderr


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_no_token_is_refused_at_start(world: World, env: dict[str, str]) -> None:
    """Before: the worker said ready, then logged a traceback every 2 s for ever."""
    code, out, err = _start(env, ORBIT_API_URL=world.api.base_url)
    assert code == 2, (out, err)
    line = _one_line(err)
    assert "ORBIT_API_TOKEN" in line and "is not set" in line
    code, _out, err = _start(env, ORBIT_API_URL=world.api.base_url, ORBIT_API_TOKEN="  ")
    assert code == 2 and "ORBIT_API_TOKEN" in _one_line(err)


def test_a_wrong_token_is_refused_without_showing_it(world: World, env: dict[str, str]) -> None:
    token = "orbit_" + secrets.token_hex(16)
    code, out, err = _start(env, ORBIT_API_URL=world.api.base_url, ORBIT_API_TOKEN=token)
    assert code == 2, (out, err)
    line = _one_line(err)
    assert "ORBIT_API_TOKEN" in line and "401" in line and token not in out + err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:{port}", "http://127.0.0.1:{port}"),  # nothing listens
        ("http://user:s3cret@127.0.0.1:{port}/", "http://***@127.0.0.1:{port}"),
        ("ftp://127.0.0.1:{port}", "ftp://127.0.0.1:{port}"),  # not http(s)
        ("127.0.0.1:{port}", "127.0.0.1:{port}"),  # no scheme
    ],
)
def test_an_api_url_that_does_not_answer_is_refused_naming_it(
    world: World, env: dict[str, str], url: str, shown: str
) -> None:
    """Before: a missing or wrong ORBIT_API_URL only warned each tick, never naming the URL."""
    port = _closed_port()
    code, out, err = _start(env, ORBIT_API_URL=url.format(port=port), ORBIT_API_TOKEN=world.token)
    assert code == 2, (out, err)
    line = _one_line(err)
    assert "ORBIT_API_URL" in line and shown.format(port=port) in line, line
    assert "s3cret" not in out + err


def test_a_url_that_is_not_the_orbit_api_is_refused(world: World, env: dict[str, str]) -> None:
    """A server that answers, but not as the platform API (404 for /v1/credential)."""
    wrong = world.api.base_url + "/nothing-here"
    code, out, err = _start(env, ORBIT_API_URL=wrong, ORBIT_API_TOKEN=world.token)
    assert code == 2, (out, err)
    line = _one_line(err)
    assert "ORBIT_API_URL" in line and wrong in line and "404" in line, line


def _queue_lengths_after_beat(
    env: dict[str, str], tmp_path: Path, seconds: float
) -> dict[str, int]:
    """Run a real ``orbit beat`` for ``seconds`` (1 s ticks) with nothing consuming; the length
    of each queue in Redis afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    env = {**env, "CELERY_BROKER_URL": REDIS_URL, "ORBIT_SENDER_TICK_SECONDS": "1"}
    env["ORBIT_TICK_SECONDS"] = "2"
    with started([str(ORBIT), "beat"], env, tmp_path / "beat.log") as beat:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert beat.proc.poll() is None, beat.text()
            time.sleep(0.2)
        log = beat.text()
    try:
        return {q: int(client.llen(q)) for q in (SENDER_QUEUE, CONTROL_QUEUE)} | {"log": len(log)}
    finally:
        client.flushdb()
        client.close()


@pytest.mark.redis
def test_an_archive_only_deployment_gets_no_sender_ticks(world: World, tmp_path: Path) -> None:
    """Before: beat published orbit.sender.tick every 2 s whether or not an outbox existed; in an
    archive-only deployment orbit.sender grew by ~43,000 messages a day. Beat now schedules the
    ticks of the databases the environment names (as its schema check does)."""
    archive_only = orbit_env(world.platform_url, ORBIT_VAR_DIR=str(tmp_path / "var"))
    got = _queue_lengths_after_beat(archive_only, tmp_path, 8.0)
    assert got[CONTROL_QUEUE] >= 1, got  # beat ran and published its archive tick
    assert got[SENDER_QUEUE] == 0, got


def _app_env(**extra: str) -> dict[str, str]:
    """An application's environment without any orbit variable nor CELERY_BROKER_URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    return {**env, **extra}


def test_the_demo_application_writes_its_wake_ups_inside_the_demo_folder(tmp_path: Path) -> None:
    """Before: ``make demo`` left wake-up files in ./var/broker, outside var/demo/ (the demo's
    own enqueue ran with the default ORBIT_VAR_DIR of its working directory)."""
    root = tmp_path / "demo"
    with migrated_engine(f"sqlite:///{root / 'business.sqlite3'}", "business"):
        pass
    code = "from pathlib import Path; from orbit_tasks.dev.demo import Demo; "
    code += f"Demo(Path('demo')).enqueue('{'ab' * 16}', '{'cd' * 16}')"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_app_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]  # nothing outside it
    assert len(list((root / "broker").glob("*.orbit.sender.msg"))) == 1


def test_wake_ups_nobody_consumes_do_not_pile_up_on_the_filesystem_broker(
    tmp_path: Path,
) -> None:
    """Before: an application without CELERY_BROKER_URL wrote one wake-up file per commit into
    the filesystem broker's folder, for ever, when no sender worker consumed it. A wake-up only
    says "run a pass": once a few are waiting, another adds nothing and is not written."""
    var = tmp_path / "var"
    url = f"sqlite:///{tmp_path / 'business.sqlite3'}"
    with migrated_engine(url, "business"):
        pass
    code = f"""
from orbit_tasks.db.engine import make_engine
from orbit_tasks.sender import enqueue
engine = make_engine({url!r})
for i in range(60):
    with engine.begin() as conn:
        enqueue(conn, namespace_id="ab" * 16, queue_id="cd" * 16, operation_id=f"{{i:032x}}",
                request={{"i": i}}, source_ref=f"orders/{{i}}")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_app_env(ORBIT_VAR_DIR=str(var)),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    waiting = list((var / "broker").glob("*.orbit.sender.msg"))
    assert 1 <= len(waiting) <= MAX_WAITING_FILE_WAKEUPS, len(waiting)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["business.sqlite3", "var"]
