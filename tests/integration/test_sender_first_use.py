"""What an application developer meets first with the sender (issue 23, "first use"): a real
``orbit worker sender`` refuses to start without a usable credential and API, in one line naming
the variable (and the URL, its password hidden), exit 2, before any Celery process starts."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import sender as sender_support
from tests.support.cli import orbit_env, run_orbit
from tests.support.db import migrated_engine
from tests.support.sender import World

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
        ("http://user:s3cret@127.0.0.1:{port}/", "http://user:***@127.0.0.1:{port}"),
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
