"""The shared fixtures of the test scene, registered once (``pytest_plugins`` in
tests/conftest.py); a module overrides one by defining a fixture of the same name.

- ``ae``: an :class:`~tests.support.archive_jobs.ArchiveEnv` on the test's MariaDB platform
  database (``archive_overrides``: settings a module changes, e.g. a shorter lease);
- ``workers`` and ``beat``: the sender's ``celery worker -Q orbit.sender`` processes and an app
  that publishes its ticks as beat would (Redis db 3, flushed before and after);
- ``business_db``: a migrated business database and its URL, once on MariaDB and once on SQLite
  (``indirect`` parametrization picks one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine

from tests.support.archive_jobs import ArchiveEnv, archive_env
from tests.support.db import mariadb_database, migrated_engine
from tests.support.sender import REDIS_URL as SENDER_REDIS_URL
from tests.support.sender import Workers


@pytest.fixture
def archive_overrides() -> dict[str, str]:
    """Environment over the defaults of :func:`archive_env` (none unless a module says)."""
    return {}


@pytest.fixture
def ae(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, archive_overrides: dict[str, str]
) -> Iterator[ArchiveEnv]:
    with archive_env(mariadb_url, platform_engine, tmp_path, **archive_overrides) as env:
        yield env


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    redis.Redis.from_url(SENDER_REDIS_URL).flushdb()
    w = Workers(tmp_path)
    try:
        yield w
    finally:
        w.stop_all()
        redis.Redis.from_url(SENDER_REDIS_URL).flushdb()


@pytest.fixture
def beat() -> Iterator[Celery]:
    app = Celery("sender-test-beat", broker=SENDER_REDIS_URL)
    try:
        yield app
    finally:
        app.close()


@pytest.fixture(params=["mariadb", "sqlite"])
def business_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    if request.param == "mariadb":
        with mariadb_database("orbit_sr") as url, migrated_engine(url, "business") as engine:
            yield url, engine
    else:
        url = f"sqlite:///{tmp_path / 'business.sqlite3'}"
        with migrated_engine(url, "business") as engine:
            yield url, engine
