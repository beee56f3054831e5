"""One validated settings object, read once from the environment (SPEC §9).

Defaults are the embedded ones: SQLite files and a filesystem Celery broker under ``./var/``, so
``orbit demo`` needs no server. Every bound is checked here, with a message naming the variable,
the bad value and the allowed range.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from orbit_tasks.errors import InvalidInput
from orbit_tasks.sender import limits as sender_limits


@dataclass(frozen=True)
class Settings:
    var_dir: Path
    database_url: str
    sender_database_url: str
    broker_url: str
    api_url: str
    api_token: str | None
    archive_lease_seconds: int
    archive_slice_seconds: int
    archive_max_stalls: int
    archive_wakeups_per_tick: int
    sender_lease_seconds: int
    sender_http_timeout_seconds: float
    sender_concurrency: int
    tick_seconds: int
    sender_tick_seconds: int
    actor: str

    @property
    def broker_is_filesystem(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{name}={raw!r} is not an integer (allowed {lo}..{hi})") from None
    if not lo <= value <= hi:
        raise InvalidInput(f"{name}={value} is out of range (allowed {lo}..{hi})")
    return value


def _float(
    env: Mapping[str, str],
    name: str,
    default: float,
    lo: float,
    hi: float,
    *,
    context: str = "",
) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(
            f"{name}={raw!r} is not a number (allowed {lo:g}..{hi:g}{context})"
        ) from None
    if not (math.isfinite(value) and lo <= value <= hi):
        raise InvalidInput(f"{name}={value} is out of range (allowed {lo:g}..{hi:g}{context})")
    return value


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build and validate settings from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    var_dir = Path(env.get("ORBIT_VAR_DIR") or "var").resolve()
    lease = _int(env, "ORBIT_ARCHIVE_LEASE_SECONDS", 120, 4, 86400)
    slice_s = _int(env, "ORBIT_ARCHIVE_SLICE_SECONDS", 20, 1, 86400)
    if slice_s >= lease:
        raise InvalidInput(
            f"ORBIT_ARCHIVE_SLICE_SECONDS={slice_s} must be below "
            f"ORBIT_ARCHIVE_LEASE_SECONDS={lease} (allowed 1..{lease - 1})"
        )
    sender_lease = _int(
        env,
        "ORBIT_SENDER_LEASE_SECONDS",
        60,
        sender_limits.MIN_LEASE_SECONDS,
        sender_limits.MAX_LEASE_SECONDS,
    )
    # Bounded by the lease so that a relay pass ends before its Celery soft limit (docs/sender.md).
    http_timeout = _float(
        env,
        "ORBIT_SENDER_HTTP_TIMEOUT_SECONDS",
        sender_limits.default_http_seconds(sender_lease),
        sender_limits.MIN_HTTP_SECONDS,
        sender_limits.max_http_seconds(sender_lease),
        context=f" for ORBIT_SENDER_LEASE_SECONDS={sender_lease}",
    )
    return Settings(
        var_dir=var_dir,
        database_url=env.get("ORBIT_DATABASE_URL") or f"sqlite:///{var_dir / 'platform.sqlite3'}",
        sender_database_url=env.get("ORBIT_SENDER_DATABASE_URL")
        or f"sqlite:///{var_dir / 'business.sqlite3'}",
        broker_url=env.get("CELERY_BROKER_URL") or "filesystem://",
        api_url=(env.get("ORBIT_API_URL") or "http://127.0.0.1:8080").rstrip("/"),
        api_token=env.get("ORBIT_API_TOKEN") or None,
        archive_lease_seconds=lease,
        archive_slice_seconds=slice_s,
        archive_max_stalls=_int(env, "ORBIT_ARCHIVE_MAX_STALLS", 20, 1, 10000),
        archive_wakeups_per_tick=_int(env, "ORBIT_ARCHIVE_WAKEUPS_PER_TICK", 100, 1, 100000),
        sender_lease_seconds=sender_lease,
        sender_http_timeout_seconds=http_timeout,
        sender_concurrency=_int(env, "ORBIT_SENDER_CONCURRENCY", 8, 1, 256),
        tick_seconds=_int(env, "ORBIT_TICK_SECONDS", 60, 1, 3600),
        sender_tick_seconds=_int(env, "ORBIT_SENDER_TICK_SECONDS", 2, 1, 3600),
        actor=env.get("ORBIT_ACTOR") or env.get("USER") or "operator",
    )


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
