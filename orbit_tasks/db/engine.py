"""Engines and the one database clock.

MySQL/MariaDB: mysqlclient with ``charset=utf8mb4``, ``READ COMMITTED`` (claims are
compare-and-set updates; no gap locks needed), pre-ping. SQLite (embedded default): WAL,
a busy timeout, and ``BEGIN IMMEDIATE`` for every transaction so that a compare-and-set claim
never has to upgrade a read lock (SQLite would fail such an upgrade with "database is locked").
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection, make_url

from orbit_tasks.db import collation as _collation  # noqa: F401 - registers the DDL hook


def is_mysql(bind: Engine | Connection) -> bool:
    return bind.dialect.name in ("mysql", "mariadb")


def is_mariadb(bind: Engine | Connection) -> bool:
    return bool(getattr(bind.dialect, "is_mariadb", False))


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` with this project's connection rules."""
    parsed = make_url(url)
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        # The mysql dialect detects MariaDB from the server; "mariadb://" URLs would ignore the
        # mysql_* table options (engine, charset, collation) of the schema.
        parsed = parsed.set(drivername="mysql+mysqldb")
        if "charset" not in parsed.query:
            parsed = parsed.update_query_dict({"charset": "utf8mb4"})
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_recycle", 3600)
        kwargs.setdefault("isolation_level", "READ COMMITTED")
        engine = create_engine(parsed, **kwargs)

        @event.listens_for(engine, "connect")
        def _utc_session(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("SET time_zone = '+00:00'")
            cur.close()

        return engine
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("connect_args", {"timeout": 30})
        engine = create_engine(parsed, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=FULL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(parsed, **kwargs)


_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


def db_now(conn: Connection) -> dt.datetime:
    """The database clock (UTC, naive). Every lease and schedule decision uses this one clock."""
    if is_mysql(conn):
        value = conn.execute(text("SELECT UTC_TIMESTAMP(6)")).scalar_one()
        assert isinstance(value, dt.datetime)
        return value
    raw = conn.execute(text(f"SELECT {_SQLITE_NOW}")).scalar_one()
    return dt.datetime.fromisoformat(str(raw))
