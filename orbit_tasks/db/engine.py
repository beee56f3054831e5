"""Engines and the one database clock (and its seam for tests).

MySQL/MariaDB: mysqlclient with ``charset=utf8mb4``, ``READ COMMITTED`` (claims are
compare-and-set updates; no gap locks needed), pre-ping. SQLite (embedded default): WAL,
a busy timeout, and ``BEGIN IMMEDIATE`` for every transaction so that a compare-and-set claim
never has to upgrade a read lock (SQLite would fail such an upgrade with "database is locked").
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import DateTime, Engine, create_engine, event, literal, literal_column, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement

from orbit_tasks.db import collation as _collation  # noqa: F401 - registers the DDL hook
from orbit_tasks.db.types import DateTime6


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


# --- the clock seam (SPEC §2: one clock) ----------------------------------------------------------


class Clock(Protocol):
    """Where a store reads time. ``now`` is a value (for pure rules that decide in Python);
    ``sql`` is the same clock as an expression inside a statement (``now + seconds``), so a
    compare-and-set or a lease end needs no separate clock read. Production: :data:`DB_CLOCK`;
    tests inject a :class:`FixedClock` to stand exactly at a lease boundary without sleeping."""

    def now(self, conn: Connection) -> dt.datetime: ...

    def sql(self, seconds: int = 0) -> ColumnElement[dt.datetime]: ...


class _db_clock(FunctionElement[dt.datetime]):  # noqa: N801 - SQL-function style name
    """``UTC_TIMESTAMP(6) [+ INTERVAL n SECOND]``; SQLite: the same instant as text in the
    6-digit form SQLAlchemy stores datetimes in (string comparisons stay exact)."""

    type = DateTime()
    inherit_cache = True
    name = "db_clock"

    def __init__(self, seconds: int) -> None:
        self.seconds = int(seconds)
        # the literal makes the offset part of the statement's cache key
        super().__init__(literal_column(str(self.seconds)))


@compiles(_db_clock, "mysql")
@compiles(_db_clock, "mariadb")
def _db_clock_mysql(element: _db_clock, compiler: Any, **kw: Any) -> str:
    if element.seconds == 0:
        return "UTC_TIMESTAMP(6)"
    return f"(UTC_TIMESTAMP(6) + INTERVAL {element.seconds} SECOND)"


@compiles(_db_clock)
def _db_clock_sqlite(element: _db_clock, compiler: Any, **kw: Any) -> str:
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', '{element.seconds:+d} seconds') || '000')"


class _instant(FunctionElement[dt.datetime]):  # noqa: N801 - SQL-function style name
    """A fixed instant as a bound parameter; MySQL casts it so that a SELECT returns a datetime
    (a bare string parameter comes back as text there)."""

    type = DateTime()
    inherit_cache = True
    name = "instant"

    def __init__(self, at: dt.datetime) -> None:
        super().__init__(literal(at, DateTime6()))


@compiles(_instant, "mysql")
@compiles(_instant, "mariadb")
def _instant_mysql(element: _instant, compiler: Any, **kw: Any) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS DATETIME(6))"


@compiles(_instant)
def _instant_sqlite(element: _instant, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


class DatabaseClock:
    """The database clock: ``UTC_TIMESTAMP(6)`` on MySQL/MariaDB, ``strftime(..., 'now')`` on
    SQLite (millisecond resolution there)."""

    def now(self, conn: Connection) -> dt.datetime:
        return db_now(conn)

    def sql(self, seconds: int = 0) -> ColumnElement[dt.datetime]:
        return _db_clock(seconds)


DB_CLOCK: Clock = DatabaseClock()


class FixedClock:
    """A clock standing at ``at`` until moved (tests: exact boundaries, no sleeping). Inside
    statements it is a bound literal of the column type, so both databases compare it exactly
    to the microsecond."""

    def __init__(self, at: dt.datetime) -> None:
        self.at = at

    def now(self, conn: Connection) -> dt.datetime:
        return self.at

    def sql(self, seconds: int = 0) -> ColumnElement[dt.datetime]:
        return _instant(self.at + dt.timedelta(seconds=seconds))

    def set(self, at: dt.datetime) -> FixedClock:
        self.at = at
        return self
