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


#: The variable -> (which database, the default file under ORBIT_VAR_DIR).
DEFAULT_FILES = {
    "ORBIT_DATABASE_URL": ("platform", "platform.sqlite3"),
    "ORBIT_SENDER_DATABASE_URL": ("business", "business.sqlite3"),
}


def is_default_url(url: str, variable: str) -> bool:
    """Whether ``url`` is the embedded default (``variable`` unset: the SQLite file under
    ``ORBIT_VAR_DIR``)."""
    entry = DEFAULT_FILES.get(variable)
    return entry is not None and url == f"sqlite:///{get_settings().var_dir / entry[1]}"


def describe_database(url: str, variable: str) -> str:
    """Which database a command uses, for its first line or an error (issue 27): the SQLite
    file's absolute path, or the redacted URL; and whether it is the default."""
    parsed = parse_database_url(url, variable)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        where = str(Path(str(parsed.database)).resolve())
    else:
        where = redact_url(url)
    if is_default_url(url, variable):
        return f"{where} ({variable} is not set: the default under ORBIT_VAR_DIR)"
    return f"{where} ({variable})"


def _require_sqlite_file(url: str, variable: str, fix: str) -> None:
    parsed = parse_database_url(url, variable)  # a bad URL is named first (exit 2)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    path = Path(str(parsed.database))
    if path.exists():
        return
    if is_default_url(url, variable):
        # Not `fix`: it would create a second, empty database beside the real one (issue 27).
        which = DEFAULT_FILES[variable][0]
        raise DatabaseMissing(
            f"{variable} is not set and the default {which} database {path.resolve()} does not "
            f"exist: set {variable} to your {which} database, or ORBIT_VAR_DIR=var/demo to "
            f"look at the demo's (`{fix}` would create a new, empty database there)"
        )
    raise DatabaseMissing(
        f"{variable} {redact_url(url)!r}: the database file does not exist; check the path, "
        f"or run `{fix}` to create a new, empty database there"
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
