"""Process-wide engines for the two databases, created lazily from the settings.

An embedded SQLite file is created only by the command that creates the schema (``db upgrade``,
``sender db upgrade``: ``create=True``). Any other command finds it missing and says which
upgrade to run, instead of leaving an empty database file behind (a refused command writes
nothing, docs/cli.md).

The archive's source (``ORBIT_ARCHIVE_SOURCE_URL``, a replica) gets an engine of its own with
the platform database's bounds; without it the source is the platform engine itself.

Every session sets the bounds of :mod:`orbit_tasks.db.session_bounds` derived from the lease of
the work on that database: the archive lease for the platform database, the sender lease for the
business database (docs/operations.md "Partitions and frozen nodes").
"""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import Engine

from orbit_tasks.db.engine import engine_for_setting, parse_database_url
from orbit_tasks.db.session_bounds import SessionBounds, bounds_for_lease
from orbit_tasks.errors import OrbitError
from orbit_tasks.redaction import redact_url
from orbit_tasks.settings import get_settings

_lock = threading.Lock()
_engines: dict[tuple[str, SessionBounds], Engine] = {}


class DatabaseMissing(OrbitError):
    """The embedded SQLite file of a database does not exist yet."""


def _require_sqlite_file(url: str, variable: str, fix: str) -> None:
    parsed = parse_database_url(url, variable)  # a bad URL is named first (exit 2)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    if not Path(str(parsed.database)).exists():
        raise DatabaseMissing(
            f"{variable} {redact_url(url)!r}: the database file does not exist; run `{fix}`"
        )


def _engine(url: str, variable: str, fix: str, create: bool, lease_seconds: int) -> Engine:
    bounds = bounds_for_lease(lease_seconds)
    if create:  # `db upgrade`: a migration may run one long statement
        bounds = bounds.without_io_bound()
    key = (url, bounds)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            if not create:
                _require_sqlite_file(url, variable, fix)
            engine = _engines[key] = engine_for_setting(variable, url, bounds)
        return engine


def platform_engine(*, create: bool = False) -> Engine:
    settings = get_settings()
    return _engine(
        settings.database_url,
        "ORBIT_DATABASE_URL",
        "orbit db upgrade",
        create,
        settings.archive_lease_seconds,
    )


def source_engine() -> Engine:
    """Where the archive reads history (every batch, ``plan preview``; the manifest's count is
    the primary's):
    ``ORBIT_ARCHIVE_SOURCE_URL`` (a replica) when it is set, else the platform database. Its
    sessions have the platform database's bounds (the archive lease)."""
    settings = get_settings()
    if settings.archive_source_url is None:
        return platform_engine()
    return _engine(
        settings.archive_source_url,
        "ORBIT_ARCHIVE_SOURCE_URL",
        "orbit db upgrade",  # never used: a source URL is MySQL/MariaDB (settings)
        False,
        settings.archive_lease_seconds,
    )


def beat_engine(lease_seconds: int) -> Engine:
    """The platform database as the beat leader sees it (issue 30 item 3): session bounds from
    the beat's own short lease, so that a cut-off leader's renewal fails within seconds."""
    settings = get_settings()
    return _engine(
        settings.database_url, "ORBIT_DATABASE_URL", "orbit db upgrade", False, lease_seconds
    )


def business_engine(*, create: bool = False) -> Engine:
    settings = get_settings()
    return _engine(
        settings.sender_database_url,
        "ORBIT_SENDER_DATABASE_URL",
        "orbit sender db upgrade",
        create,
        settings.sender_lease_seconds,
    )


def dispose_all_for_fork() -> None:
    """Call in a forked child: drop inherited pool connections without closing the parent's."""
    with _lock:
        for engine in _engines.values():
            engine.dispose(close=False)
