"""Helpers for tests that need real databases: throw-away MariaDB schemas and SQLite files."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, text

from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.migrate import upgrade

MARIADB_SERVER_URL = os.environ.get("ORBIT_TEST_MARIADB_URL", "mysql+mysqldb://root@127.0.0.1:3306")
# The Redis server the tests use (one per concurrent test run: the suites flush their databases).
REDIS_SERVER = os.environ.get("ORBIT_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")


def redis_url(db: int) -> str:
    """URL of database ``db`` on the test Redis server."""
    return f"{REDIS_SERVER}/{db}"


REDIS_TEST_URL = redis_url(1)


def server_engine() -> Engine:
    return create_engine(MARIADB_SERVER_URL + "/?charset=utf8mb4", isolation_level="AUTOCOMMIT")


@contextmanager
def mariadb_database(prefix: str = "orbit_t") -> Iterator[str]:
    """Create an empty utf8mb4 database, yield its URL, drop it afterwards."""
    name = f"{prefix}_{secrets.token_hex(5)}"
    admin = server_engine()
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        yield f"{MARIADB_SERVER_URL}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


@contextmanager
def migrated_engine(url: str, chain: str) -> Iterator[Engine]:
    engine = make_engine(url)
    upgrade(engine, chain)  # type: ignore[arg-type]
    try:
        yield engine
    finally:
        engine.dispose()


def open_write_transactions(engine: Engine) -> list[int]:
    """Rows modified by each open transaction of another session on ``engine``'s database (a
    frozen holder's), on MariaDB: other databases of the server are other tests'."""
    with engine.connect() as conn:
        return [
            int(n)
            for (n,) in conn.execute(
                text(
                    "SELECT t.trx_rows_modified FROM information_schema.innodb_trx t "
                    "JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id "
                    "WHERE t.trx_rows_modified > 0 AND p.id <> CONNECTION_ID() "
                    "AND p.db = DATABASE()"
                )
            )
        ]
