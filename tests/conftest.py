from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine

from orbit_tasks.db.engine import make_engine
from tests.support import db as test_db
from tests.support.db import mariadb_database, migrated_engine

pytest_plugins = ["tests.support.fixtures"]  # ae, workers, beat, business_db: the test scene

# enqueue() publishes a sender wake-up after each commit (docs/sender.md). The tests' own process
# has no broker of its own (the filesystem default would collect wake-ups in ./var/broker), so it
# is off here; tests/integration/test_sender_wakeup.py turns it on with the broker it means.
os.environ.setdefault("ORBIT_SENDER_WAKE_ON_COMMIT", "0")

#: Tests that cannot share the machine with one another run on one xdist worker, one at a time
#: (``--dist loadgroup``): the network-namespace tests (addresses of 10.213.0.0/16 drawn from the
#: process id, iptables rules) and the ``heavy`` timing-sensitive runs with several workers.
SERIAL_GROUP = "one-at-a-time"
SERIAL_MODULES = ("test_partition_archive.py",)

_worker_redis: subprocess.Popen[bytes] | None = None
_worker_redis_dir: Path | None = None


def _start_worker_redis() -> None:
    """An xdist worker gets a redis-server of its own before any test module is imported (the
    suites flush their Redis databases; MariaDB databases carry the worker's name already).
    Called when this conftest is imported: before ``pytest_plugins`` below is loaded, whose
    modules compute their Redis URLs at import (a ``pytest_configure`` hook ran after them, and
    the scene's fixtures pointed every xdist worker at the shared server)."""
    global _worker_redis, _worker_redis_dir
    if test_db.XDIST_WORKER and _worker_redis is None:
        _worker_redis_dir = Path(
            tempfile.mkdtemp(prefix=f"orbit-test-redis-{test_db.XDIST_WORKER}-")
        )
        _worker_redis = test_db.start_worker_redis(_worker_redis_dir)


_start_worker_redis()


def pytest_unconfigure(config: pytest.Config) -> None:
    global _worker_redis
    if _worker_redis is not None:
        _worker_redis.kill()
        _worker_redis.wait(timeout=10)
        _worker_redis = None
    if _worker_redis_dir is not None:
        shutil.rmtree(_worker_redis_dir, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("heavy") or item.path.name in SERIAL_MODULES:
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))


@pytest.fixture
def mariadb_url() -> Iterator[str]:
    """URL of a fresh, empty MariaDB database (dropped after the test)."""
    with mariadb_database() as url:
        yield url


@pytest.fixture
def platform_engine(mariadb_url: str) -> Iterator[Engine]:
    """A migrated platform database on the real MariaDB."""
    with migrated_engine(mariadb_url, "platform") as engine:
        yield engine


@pytest.fixture
def business_engine() -> Iterator[Engine]:
    """A migrated business (sender) database on the real MariaDB."""
    with mariadb_database("orbit_b") as url, migrated_engine(url, "business") as engine:
        yield engine


#: The one SQLite + MariaDB matrix: the SQLite half runs without MariaDB (``-m "not mariadb"``).
BOTH_DATABASES = ["sqlite", pytest.param("mariadb", marks=pytest.mark.mariadb)]


@pytest.fixture(params=BOTH_DATABASES)
def database(request: pytest.FixtureRequest) -> str:
    """Which database a matrix test runs on: ``sqlite`` or ``mariadb``."""
    return str(request.param)


@contextmanager
def _migrated(
    database: str, chain: str, tmp_path: Path, prefix: str
) -> Iterator[tuple[str, Engine]]:
    if database == "sqlite":
        url = f"sqlite:///{tmp_path / f'{chain}.sqlite3'}"
        with migrated_engine(url, chain) as engine:
            yield url, engine
    else:
        with mariadb_database(prefix) as url, migrated_engine(url, chain) as engine:
            yield url, engine


@pytest.fixture
def any_platform_url(database: str, tmp_path: Path) -> Iterator[str]:
    """A migrated platform database URL, once on SQLite and once on MariaDB."""
    with _migrated(database, "platform", tmp_path, "orbit_t") as (url, _engine):
        yield url


@pytest.fixture
def any_platform_engine(any_platform_url: str) -> Iterator[Engine]:
    """An engine on :func:`any_platform_url` (the store contract suites)."""
    engine = make_engine(any_platform_url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def any_business_engine(database: str, tmp_path: Path) -> Iterator[Engine]:
    """A migrated business (sender) database, once on SQLite and once on MariaDB."""
    with _migrated(database, "business", tmp_path, "orbit_sk") as (_url, engine):
        yield engine
