"""Helpers for tests that need real databases: throw-away MariaDB schemas and SQLite files."""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, text

from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.migrate import upgrade

MARIADB_SERVER_URL = os.environ.get("ORBIT_TEST_MARIADB_URL", "mysql+mysqldb://root@127.0.0.1:3306")
# The Redis server the tests use (one per concurrent test run: the suites flush their databases).
# Under pytest-xdist each worker process starts a redis-server of its own (tests/conftest.py,
# :func:`start_worker_redis`) and points this at it before any test module is collected.
REDIS_SERVER = os.environ.get("ORBIT_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")
#: The pytest-xdist worker this process is (``gw0``, ``gw1``...), ``""`` in a serial run.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def redis_url(db: int) -> str:
    """URL of database ``db`` on the test Redis server (this xdist worker's own server)."""
    return f"{REDIS_SERVER}/{db}"


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the worker that started it dies (Linux)."""
    with_libc = ctypes.CDLL(None, use_errno=True)
    with_libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def start_worker_redis(workdir: Path) -> subprocess.Popen[bytes]:
    """Start a private, empty, non-persistent redis-server on a free loopback port, make it the
    test Redis server of this process (:data:`REDIS_SERVER`, ``ORBIT_TEST_REDIS`` for child
    processes) and return it: the xdist worker's own, so workers never flush each other's DBs."""
    global REDIS_SERVER
    workdir.mkdir(parents=True, exist_ok=True)
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    for _attempt in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        log = workdir / f"redis-{port}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(workdir), "--databases", "16"],
                stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    REDIS_SERVER = f"redis://127.0.0.1:{port}"
                    os.environ["ORBIT_TEST_REDIS"] = REDIS_SERVER
                    return proc
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=10)  # the port was taken in between: try another
    raise AssertionError(f"redis-server did not start: {log.read_text(errors='replace')}")


def server_engine() -> Engine:
    return create_engine(MARIADB_SERVER_URL + "/?charset=utf8mb4", isolation_level="AUTOCOMMIT")


@contextmanager
def mariadb_database(prefix: str = "orbit_t") -> Iterator[str]:
    """Create an empty utf8mb4 database, yield its URL, drop it afterwards."""
    # The xdist worker's name in it: two workers can never draw the same name.
    name = f"{prefix}_{XDIST_WORKER}{secrets.token_hex(5)}"
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
