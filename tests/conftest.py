from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.dbutil import mariadb_database, migrated_engine


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


@pytest.fixture(params=["sqlite", "mariadb"])
def any_platform_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated platform database URL, once on SQLite and once on MariaDB."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
        with migrated_engine(url, "platform"):
            yield url
    else:
        with mariadb_database() as url, migrated_engine(url, "platform"):
            yield url
