"""Process-wide engines for the two databases, created lazily from the settings."""

from __future__ import annotations

import threading

from sqlalchemy import Engine

from orbit_tasks.db.engine import make_engine
from orbit_tasks.settings import get_settings

_lock = threading.Lock()
_engines: dict[str, Engine] = {}


def _engine(url: str) -> Engine:
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = make_engine(url)
        return engine


def platform_engine() -> Engine:
    return _engine(get_settings().database_url)


def business_engine() -> Engine:
    return _engine(get_settings().sender_database_url)


def dispose_all_for_fork() -> None:
    """Call in a forked child: drop inherited pool connections without closing the parent's."""
    with _lock:
        for engine in _engines.values():
            engine.dispose(close=False)
