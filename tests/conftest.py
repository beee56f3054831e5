from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine

from orbit_tasks.db.engine import make_engine
from tests.support.db import mariadb_database, migrated_engine

pytest_plugins = ["tests.support.fixtures"]  # ae, workers, beat, business_db: the test scene

# enqueue() publishes a sender wake-up after each commit (docs/sender.md). The tests' own process
# has no broker of its own (the filesystem default would collect wake-ups in ./var/broker), so it
# is off here; tests/integration/test_sender_wakeup.py turns it on with the broker it means.
os.environ.setdefault("ORBIT_SENDER_WAKE_ON_COMMIT", "0")


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
