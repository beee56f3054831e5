"""Process-wide engines for the two databases, created lazily from the settings."""

from __future__ import annotations

import threading

from sqlalchemy import Engine

from orbit_tasks.db.engine import engine_for_setting
from orbit_tasks.settings import get_settings

_lock = threading.Lock()
_engines: dict[str, Engine] = {}


def _engine(url: str, variable: str) -> Engine:
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = engine_for_setting(variable, url)
        return engine


def platform_engine() -> Engine:
    return _engine(get_settings().database_url, "ORBIT_DATABASE_URL")


def business_engine() -> Engine:
    return _engine(get_settings().sender_database_url, "ORBIT_SENDER_DATABASE_URL")


def dispose_all_for_fork() -> None:
    """Call in a forked child: drop inherited pool connections without closing the parent's."""
    with _lock:
        for engine in _engines.values():
            engine.dispose(close=False)
