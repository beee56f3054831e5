"""Engines and the one database clock (and its seam for tests).

MySQL/MariaDB: mysqlclient with ``charset=utf8mb4``, ``READ COMMITTED`` (claims are
compare-and-set updates; no gap locks needed), pre-ping, and the session bounds of
:mod:`orbit_tasks.db.session_bounds` set at connect (idle transactions, lock waits, socket
timeouts below the lease). SQLite (embedded default): WAL, a busy timeout, and
``BEGIN IMMEDIATE`` for every transaction so that a compare-and-set claim never has to upgrade a
read lock (SQLite would fail such an upgrade with "database is locked").
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import DateTime, Engine, create_engine, event, literal, literal_column, text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement

from orbit_tasks import oserrors
from orbit_tasks.db import collation as _collation  # noqa: F401 - registers the DDL hook
from orbit_tasks.db.session_bounds import (
    SessionBounds,
    connect_args,
    server_of,
    session_statement,
    session_variables,
)
from orbit_tasks.db.types import DateTime6
from orbit_tasks.errors import InvalidInput, OrbitError
from orbit_tasks.logs import log_action
from orbit_tasks.redaction import redact_url


def is_mysql(bind: Engine | Connection) -> bool:
    return bind.dialect.name in ("mysql", "mariadb")


def is_mariadb(bind: Engine | Connection) -> bool:
    return bool(getattr(bind.dialect, "is_mariadb", False))


# The databases this product runs on (SPEC §2); SQLite through the standard library's driver.
_SCHEMES = "mysql://, mariadb:// or sqlite:///"
#: Every scheme with a driver that is accepted; ``mariadb://`` is used as ``mysql+mysqldb://``
#: (:func:`make_engine`, documented in docs/cli.md).
_SUPPORTED = "mysql://, mysql+mysqldb://, mariadb://, mariadb+mysqldb:// or sqlite:///"
_EXAMPLE = "e.g. mysql://user@host:3306/orbit or sqlite:///var/platform.sqlite3"


def _port_text(url: str) -> str:
    authority = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    return authority.rsplit(":", 1)[-1] if ":" in authority else ""


def parse_database_url(url: str, what: str = "database URL") -> URL:
    """Parse and check a database URL before anything connects or creates a file: an unknown
    scheme, a missing ``://``, a port that is no number in 1..65535, a MySQL URL without a
    database, an unknown SQLite driver are :class:`InvalidInput` naming ``what`` (the variable)
    and the URL with its password hidden."""
    shown = f"{what} {redact_url(url)!r}"
    if "://" not in url:
        raise InvalidInput(f"{shown} is not a database URL: no scheme:// ({_EXAMPLE})")
    try:
        parsed = make_url(url)
    except ValueError:  # SQLAlchemy's int() of the port
        port = _port_text(url)
        if port.isdigit():  # the int() was of more than a port: "[::1/x", "host:1:2"
            raise InvalidInput(f"{shown} cannot be parsed as a database URL ({_EXAMPLE})") from None
        raise InvalidInput(f"{shown}: port {port!r} is not a number (allowed 1..65535)") from None
    except ArgumentError:
        raise InvalidInput(f"{shown} cannot be parsed as a database URL ({_EXAMPLE})") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in ("mysql", "mariadb", "sqlite"):
        raise InvalidInput(f"{shown} has an unsupported scheme {backend!r} (allowed: {_SCHEMES})")
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise InvalidInput(
                f"{shown} names the SQLite driver {driver!r} (allowed: sqlite:/// with the "
                "built-in driver)"
            )
        return parsed
    if driver not in ("", "mysqldb"):
        # refused, not rewritten to mysqldb behind the operator's back (issue 27): another
        # driver's options in the URL would be read by mysqlclient or silently dropped
        raise InvalidInput(
            f"{shown} names the driver {driver!r}, which is not supported (allowed: "
            f"{_SUPPORTED}; the MySQL/MariaDB driver is mysqlclient)"
        )
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise InvalidInput(f"{shown}: port {parsed.port} is out of range (allowed 1..65535)")
    if not parsed.database:
        raise InvalidInput(f"{shown} names no database (add /DATABASE to the URL)")
    return parsed


# Attribute of a SQLAlchemy error raised by an engine of :func:`engine_for_setting`: the variable
# and the URL (password hidden) of the database that failed.
SETTING_ATTR = "orbit_setting"


def engine_for_setting(what: str, url: str, bounds: SessionBounds | None = None) -> Engine:
    """:func:`make_engine` for the URL held by the environment variable ``what``: a bad URL, or a
    SQLite folder that cannot be created, is one error naming the variable (SPEC §9)."""
    parse_database_url(url, what)
    try:
        engine = make_engine(url, bounds=bounds)
    except OSError as exc:  # creating the folder of a SQLite file
        message = f"{what} {redact_url(url)!r}: {exc.filename or 'folder'}: {oserrors.reason(exc)}"
        if oserrors.is_path_error(exc):
            raise InvalidInput(message) from None
        raise OrbitError(message) from None
    setting = f"{what} {redact_url(url)!r}"

    @event.listens_for(engine, "handle_error")
    def _name_the_setting(context: Any) -> None:
        # Lets an operator message say which database failed (cli/errors.py, SETTING_ATTR).
        if context.sqlalchemy_exception is not None:
            setattr(context.sqlalchemy_exception, SETTING_ATTR, setting)

    return engine


_log = logging.getLogger("orbit.db.engine")

# Attribute of an engine made with bounds: the SessionBounds its sessions set (start checks).
BOUNDS_ATTR = "orbit_session_bounds"


def _set_session(dbapi_conn: Any, bounds: SessionBounds | None) -> None:
    """The session variables of :mod:`session_bounds` in one ``SET``; a server that refuses one
    (unknown variable, no privilege) still gets the others, and the start check warns."""
    server = server_of(str(dbapi_conn.get_server_info()))
    cur = dbapi_conn.cursor()
    try:
        try:
            cur.execute(session_statement(bounds, server))
        except Exception:  # noqa: BLE001 - one by one below; the start check reports the rest
            for name, value in session_variables(bounds, server).items():
                try:
                    cur.execute(f"SET SESSION {name} = %s", (value,))
                except Exception as exc:  # noqa: BLE001
                    log_action(
                        _log, "db.session.variable_refused", logging.WARNING,
                        variable=name, error=type(exc).__name__,
                    )  # fmt: skip
    finally:
        cur.close()


def make_engine(url: str, *, bounds: SessionBounds | None = None, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` with this project's connection rules; ``bounds``: the
    session bounds every connection sets (None: the UTC session alone, no client timeouts)."""
    parsed = parse_database_url(url)
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        # The mysql dialect detects MariaDB from the server; "mariadb://" URLs would ignore the
        # mysql_* table options (engine, charset, collation) of the schema.
        parsed = parsed.set(drivername="mysql+mysqldb")
        if "charset" not in parsed.query:
            parsed = parsed.update_query_dict({"charset": "utf8mb4"})
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_recycle", 3600)
        kwargs.setdefault("isolation_level", "READ COMMITTED")
        if bounds is not None:
            kwargs["connect_args"] = {**connect_args(bounds), **kwargs.get("connect_args", {})}
        engine = create_engine(parsed, **kwargs)
        setattr(engine, BOUNDS_ATTR, bounds)

        @event.listens_for(engine, "connect")
        def _bounded_utc_session(dbapi_conn: Any, _record: Any) -> None:
            _set_session(dbapi_conn, bounds)

        return engine
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        busy = 30 if bounds is None else bounds.sqlite_busy_seconds
        kwargs.setdefault("connect_args", {"timeout": busy})
        engine = create_engine(parsed, **kwargs)
        setattr(engine, BOUNDS_ATTR, bounds)

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={busy * 1000}")
            cur.execute("PRAGMA synchronous=FULL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(parsed, **kwargs)


def single_statements(conn: Connection) -> Connection:
    """``conn`` in autocommit on MySQL/MariaDB: each statement commits by itself, so a
    one-statement write (a claim's compare-and-set, a confirm) holds its row lock only while the
    server runs it, never while the client could vanish before a ``COMMIT``. Statements that
    must commit together go in :func:`atomic`. SQLite: unchanged (``BEGIN IMMEDIATE``)."""
    if is_mysql(conn):
        return conn.execution_options(isolation_level="AUTOCOMMIT")
    return conn


@contextmanager
def atomic(conn: Connection) -> Iterator[Connection]:
    """One transaction of several statements on ``conn``, also when ``conn`` is in autocommit
    (:func:`single_statements`): an explicit ``START TRANSACTION``, ended by the ``COMMIT`` or
    ``ROLLBACK`` that the DB-API sends when the block ends."""
    autocommit = is_mysql(conn) and conn.get_execution_options().get("isolation_level") == (
        "AUTOCOMMIT"
    )
    if autocommit and conn.in_transaction():
        conn.commit()  # an autobegun no-op: each earlier statement has committed by itself
    with conn.begin():
        if autocommit:
            conn.exec_driver_sql("START TRANSACTION")
        yield conn


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
