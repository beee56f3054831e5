"""One validated settings object, read once from the environment (SPEC §9).

Defaults are the embedded ones: SQLite files and a filesystem Celery broker under ``./var/``, so
``orbit demo`` needs no server. Every bound is checked here, with a message naming the variable,
the bad value and the allowed range.
"""

from __future__ import annotations

import functools
import math
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from orbit_tasks import archive_limits, sender_limits, units
from orbit_tasks.errors import InvalidInput

LOG_FORMATS = ("text", "json")  # ORBIT_LOG_FORMAT; orbit_tasks.logs writes them
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")  # ORBIT_LOG_LEVEL
# ORBIT_ARCHIVE_READER: where the read-ahead runs (docs/archive-jobs.md "The reader process")
ARCHIVE_READERS = ("auto", "process", "thread")


@dataclass(frozen=True)
class Settings:
    var_dir: Path
    database_url: str
    sender_database_url: str
    broker_url: str
    api_url: str
    api_token: str | None = field(repr=False)
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
    # SPEC §12 "Logs": text|json; None = the process's own default (WARNING for one-shot CLI
    # commands, INFO for workers, beat, the API and Flower).
    log_format: str = "text"
    log_level: str | None = None
    # SPEC §12 "Flower": ``user:password`` entries; kept out of repr so it is never printed.
    flower_basic_auth: tuple[str, ...] = field(default=(), repr=False)
    # The exporter (docs/metrics.md): read-cache lifetime, per-source time bound, and whether
    # ORBIT_SENDER_DATABASE_URL was given (the exporter reads the business database only then).
    metrics_cache_seconds: int = 15
    metrics_timeout_seconds: float = 5.0
    sender_database_configured: bool = False
    # ORBIT_SENDER_RETENTION (docs/sender.md "Retention"): prune ACCEPTED (and resolved REVIEW)
    # outbox rows older than this from beat; None = off (the default).
    sender_retention_seconds: int | None = None
    # Who an operator command records (``sender resolve``; the same rule as the archive
    # controls of issue 16): ORBIT_OPERATOR, else ORBIT_ACTOR, else the OS user.
    operator: str = "operator"
    # enqueue() publishes one sender wake-up after the caller's transaction commits
    # (docs/sender.md "Delivery right after commit"): on/off, and the bound of that publish.
    sender_wake_on_commit: bool = True
    sender_wake_timeout_seconds: float = 0.5
    # Issue 16 (docs/archive-controls.md): the load guard (None = off) and who changes controls.
    archive_max_threads_running: int | None = None
    # The archive controls on the hot path; off only in the bench's baseline (never from env).
    archive_controls: bool = True
    # ORBIT_ARCHIVE_SOURCE_URL: where the archive reads history (a replica of the platform
    # database, docs/operations.md "Read from a replica"); None: the platform database itself.
    archive_source_url: str | None = field(default=None, repr=False)
    archive_reader: str = "auto"
    # ORBIT_ARCHIVE_PAUSE_ALERT_AFTER (issue 27, docs/operations.md "OrbitArchivePauseForgotten"):
    # a pause older than this raises the alert; the exporter serves it beside the pauses' ages.
    archive_pause_alert_after_seconds: int = 86400
    # ORBIT_BEAT_LEASE_SECONDS (issue 30 item 3): the beat leader's lease; None = three quarters
    # of the shortest tick period (orbit_tasks/beat/rules.py).
    beat_lease_seconds: int | None = None
    # Issue 28 item 3 (docs/operations.md "Scrub"): re-verify every SUCCEEDED job this many days
    # after its last verification (0 = off), reading at most this many bytes per second of one
    # storage, and rebuild what does not verify from the source (ORBIT_ARCHIVE_SCRUB_REPAIR).
    archive_scrub_days: int = 30
    archive_scrub_bytes_per_second: int = 8 * 1024 * 1024
    archive_scrub_repair: bool = False

    @property
    def broker_is_filesystem(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    def filesystem_broker_options(self) -> dict[str, object]:
        """kombu's transport options of the embedded filesystem broker under ``var_dir`` (the
        workers' celeryconfig and the after-commit wake-up publish through the same folders)."""
        folder = str(self.var_dir / "broker")
        return {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "processed_folder": str(self.var_dir / "broker-processed"),
            # kombu keeps exchange bindings in "control_folder" (default: ./control in the cwd).
            "control_folder": str(self.var_dir / "broker-control"),
            "store_processed": False,
        }

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """A count (``ORBIT_SENDER_CONCURRENCY``): ASCII digits only (units.py, the one rule)."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = units.ascii_int(raw)
    if value is None:
        raise InvalidInput(
            f"{name}={units.shown(raw)} is not an integer (allowed {lo}..{hi}; "
            f"{units.INTEGER_FORMS})"
        )
    if not lo <= value <= hi:
        raise InvalidInput(f"{name}={value} is out of range (allowed {lo}..{hi})")
    return value


def _seconds(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """A duration variable named for its unit (``ORBIT_TICK_SECONDS``): a bare number is seconds,
    as documented, and the command line's forms (``2m``) are accepted too (units.py); whole
    seconds only."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        seconds = units.parse_env_duration(raw, name)
    except InvalidInput:
        raise InvalidInput(
            f"{name}={units.shown(raw)} is not a duration (allowed {lo}..{hi}: seconds as ASCII "
            "digits, or with s, m, h or d, e.g. 90s or 2m; no sign, no spaces)"
        ) from None
    if seconds != int(seconds):
        raise InvalidInput(
            f"{name}={units.shown(raw)} is not an integer number of seconds (allowed {lo}..{hi})"
        )
    if not lo <= seconds <= hi:
        raise InvalidInput(f"{name}={raw} is out of range (allowed {lo}..{hi})")
    return int(seconds)


def _float(
    env: Mapping[str, str],
    name: str,
    default: float,
    lo: float,
    hi: float,
    *,
    context: str = "",
) -> float:
    """A duration variable in (fractions of) seconds (``ORBIT_METRICS_TIMEOUT_SECONDS=0.5``): a
    bare decimal number is seconds, and the forms of units.py (``90s``) are accepted too."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = units.parse_env_duration(raw, name)
    except InvalidInput:
        raise InvalidInput(
            f"{name}={units.shown(raw)} is not a number of seconds (allowed {lo:g}..{hi:g}"
            f"{context}: ASCII digits, e.g. 0.5, or with s, m, h or d, e.g. 30s; no sign, no "
            "spaces)"
        ) from None
    if not (math.isfinite(value) and lo <= value <= hi):
        raise InvalidInput(f"{name}={value} is out of range (allowed {lo:g}..{hi:g}{context})")
    return value


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build and validate settings from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    var_dir = Path(env.get("ORBIT_VAR_DIR") or "var").resolve()
    lease = _seconds(env, "ORBIT_ARCHIVE_LEASE_SECONDS", 120, 4, 86400)
    top = archive_limits.max_slice_seconds(lease)
    # default: 20 s, or the longest slice a shorter lease allows
    slice_s = _seconds(env, "ORBIT_ARCHIVE_SLICE_SECONDS", min(20, top), 1, 86400)
    if slice_s > top:
        # the slice must end one margin before the Celery soft limit (archive_limits.py)
        raise InvalidInput(
            f"ORBIT_ARCHIVE_SLICE_SECONDS={slice_s} is out of range for "
            f"ORBIT_ARCHIVE_LEASE_SECONDS={lease} (allowed 1..{top}: a claim ends its slice "
            "before the soft time limit)"
        )
    sender_lease = _seconds(
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
    database_url = env.get("ORBIT_DATABASE_URL") or f"sqlite:///{var_dir / 'platform.sqlite3'}"
    return Settings(
        var_dir=var_dir,
        database_url=database_url,
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
        tick_seconds=_seconds(env, "ORBIT_TICK_SECONDS", 60, 1, 3600),
        sender_tick_seconds=_seconds(env, "ORBIT_SENDER_TICK_SECONDS", 2, 1, 3600),
        actor=env.get("ORBIT_ACTOR") or env.get("USER") or "operator",
        log_format=(_choice(env, "ORBIT_LOG_FORMAT", LOG_FORMATS) or "text").lower(),
        log_level=(_choice(env, "ORBIT_LOG_LEVEL", LOG_LEVELS) or "").upper() or None,
        flower_basic_auth=_basic_auth(env, "ORBIT_FLOWER_BASIC_AUTH"),
        metrics_cache_seconds=_seconds(env, "ORBIT_METRICS_CACHE_SECONDS", 15, 0, 3600),
        metrics_timeout_seconds=_float(env, "ORBIT_METRICS_TIMEOUT_SECONDS", 5.0, 0.5, 60.0),
        sender_database_configured=bool(env.get("ORBIT_SENDER_DATABASE_URL")),
        sender_retention_seconds=_retention(env, "ORBIT_SENDER_RETENTION"),
        operator=_operator(env),
        sender_wake_on_commit=_switch(env, "ORBIT_SENDER_WAKE_ON_COMMIT", True),
        sender_wake_timeout_seconds=_float(
            env, "ORBIT_SENDER_WAKE_TIMEOUT_SECONDS", 0.5, 0.05, 5.0
        ),
        archive_max_threads_running=(
            None
            if not env.get("ORBIT_ARCHIVE_MAX_THREADS_RUNNING")
            else _int(env, "ORBIT_ARCHIVE_MAX_THREADS_RUNNING", 0, 0, 100000)
        ),
        archive_source_url=_source_url(env.get("ORBIT_ARCHIVE_SOURCE_URL") or None, database_url),
        archive_reader=(_choice(env, "ORBIT_ARCHIVE_READER", ARCHIVE_READERS) or "auto").lower(),
        archive_pause_alert_after_seconds=_pause_alert_after(env),
        beat_lease_seconds=(
            None
            if not env.get("ORBIT_BEAT_LEASE_SECONDS")
            else _int(env, "ORBIT_BEAT_LEASE_SECONDS", 0, 1, 30)
        ),
        archive_scrub_days=_scrub_days(env, "ORBIT_ARCHIVE_SCRUB_DAYS"),
        archive_scrub_bytes_per_second=_rate(env, "ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND"),
        archive_scrub_repair=_switch(env, "ORBIT_ARCHIVE_SCRUB_REPAIR", False),
    )


PAUSE_ALERT_AFTER = "ORBIT_ARCHIVE_PAUSE_ALERT_AFTER"
PAUSE_ALERT_RANGE = (60, 365 * 86400)  # 1m..365d


def _pause_alert_after(env: Mapping[str, str]) -> int:
    """How old a pause may grow before the alert (a duration with its unit, ``24h``, ``3d``;
    1m..365d; default 24h)."""
    raw = (env.get(PAUSE_ALERT_AFTER) or "").strip()
    if raw == "":
        return 86400
    allowed = "allowed 1m..365d, an integer with s, m, h or d"
    seconds = units.duration_seconds(raw, unit_required=True)
    if seconds is None:
        raise InvalidInput(f"{PAUSE_ALERT_AFTER}={raw!r} is not a duration ({allowed}, e.g. 24h)")
    lo, hi = PAUSE_ALERT_RANGE
    if not lo <= seconds <= hi:
        raise InvalidInput(f"{PAUSE_ALERT_AFTER}={raw} is out of range ({allowed})")
    return seconds


#: ORBIT_ARCHIVE_SCRUB_DAYS: the default period and its range (0 or off: no scheduled scrub).
SCRUB_DAYS_DEFAULT, SCRUB_DAYS_MAX = 30, 3650
#: ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND: the default read rate of one storage and its range.
SCRUB_RATE_DEFAULT, SCRUB_RATE_MIN, SCRUB_RATE_MAX = 8 * 1024**2, 64 * 1024, 1024**3


def _scrub_days(env: Mapping[str, str], name: str) -> int:
    """Days between two verifications of a job: 1..3650, or 0/off (no scheduled scrub)."""
    raw = (env.get(name) or "").strip()
    if raw.lower() == "off":
        return 0
    return _int(env, name, SCRUB_DAYS_DEFAULT, 0, SCRUB_DAYS_MAX)


def _rate(env: Mapping[str, str], name: str) -> int:
    """A size per second with its unit: ``8MiB`` or ``8MiB/s`` (64KiB..1GiB per second; a bare
    number is refused, as every size)."""
    raw = (env.get(name) or "").strip()
    if raw == "":
        return SCRUB_RATE_DEFAULT
    allowed = (
        f"allowed {units.format_size(SCRUB_RATE_MIN)}..{units.format_size(SCRUB_RATE_MAX)} "
        "per second, e.g. 8MiB/s"
    )
    text = raw[:-2] if raw.endswith("/s") else raw
    try:
        value = units.parse_size(text, name)
    except InvalidInput:
        raise InvalidInput(f"{name}={raw!r} is not a size per second ({allowed})") from None
    if not SCRUB_RATE_MIN <= value <= SCRUB_RATE_MAX:
        raise InvalidInput(f"{name}={raw} is out of range ({allowed})")
    return value


def _operator(env: Mapping[str, str]) -> str:
    """Who an operator command records: ORBIT_OPERATOR, else ORBIT_ACTOR, else the OS user;
    one printable line (it is stored and printed: a newline could forge an ``error:`` line)."""
    for name in ("ORBIT_OPERATOR", "ORBIT_ACTOR"):
        value = env.get(name)
        if value:
            refusal = units.one_line_refusal(value, name)
            if refusal:
                raise InvalidInput(refusal)
            return value
    return _os_user(env)


def _os_user(env: Mapping[str, str]) -> str:
    """The OS user running the command (``$USER``, else the password database)."""
    if env.get("USER"):
        return env["USER"]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return "operator"


def _retention(env: Mapping[str, str], name: str) -> int | None:
    """A duration (``7d``, ``36h``; 1s..3650d), or ``off``/unset (None)."""
    allowed = sender_limits.RETENTION_RANGE
    raw = (env.get(name) or "").strip()
    if raw == "" or raw.lower() == "off":
        return None
    seconds = units.duration_seconds(raw, unit_required=True)  # a unit, always
    if seconds is None:
        raise InvalidInput(
            f"{name}={raw!r} is not a duration (an integer with s, m, h or d, e.g. 7d; "
            f"allowed {allowed}, or off)"
        )
    if not sender_limits.MIN_RETENTION_SECONDS <= seconds <= sender_limits.MAX_RETENTION_SECONDS:
        raise InvalidInput(f"{name}={raw} is out of range (allowed {allowed}, or off)")
    return seconds


SWITCH_VALUES = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.strip().lower() not in SWITCH_VALUES:
        raise InvalidInput(f"{name}={raw!r} is not allowed (allowed 1, 0, true, false, on, off)")
    return SWITCH_VALUES[raw.strip().lower()]


_SERVER_SCHEMES = ("mysql", "mariadb")


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""


def _source_url(url: str | None, database_url: str) -> str | None:
    """``ORBIT_ARCHIVE_SOURCE_URL``: a MySQL/MariaDB replica of a MySQL/MariaDB platform
    database (the rest of the URL is checked where its engine is made, naming the variable)."""
    if url is None:
        return None
    scheme = _scheme(url)
    if scheme not in _SERVER_SCHEMES:
        shown = repr(scheme) if scheme else "none"
        raise InvalidInput(
            f"ORBIT_ARCHIVE_SOURCE_URL has the scheme {shown} (allowed: mysql:// or mariadb://, "
            "a replica of the platform database)"
        )
    if _scheme(database_url) not in _SERVER_SCHEMES:
        raise InvalidInput(
            "ORBIT_ARCHIVE_SOURCE_URL is set but ORBIT_DATABASE_URL is not MySQL/MariaDB "
            "(allowed: a replica of a mysql:// or mariadb:// platform database)"
        )
    return url


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    if raw.lower() not in {a.lower() for a in allowed}:
        raise InvalidInput(f"{name}={raw!r} is not allowed (allowed {', '.join(allowed)})")
    return raw


def _printable_ascii(text: str) -> bool:
    return all(0x21 <= ord(c) <= 0x7E for c in text)


def _basic_auth(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """``user:password[,user:password]``. Messages name the entry and its user, never a password."""
    raw = env.get(name) or ""
    if not raw.strip():
        return ()
    entries = []
    for index, entry in enumerate(raw.split(","), start=1):
        user, sep, password = entry.strip().partition(":")
        if not sep or not 1 <= len(user) <= 64 or ":" in user or not _printable_ascii(user):
            raise InvalidInput(
                f"{name} entry {index} is not user:password (user 1..64 printable ASCII "
                "characters without ':' or ',')"
            )
        if not 8 <= len(password) <= 256:
            raise InvalidInput(
                f"{name} entry {index} (user {user!r}): password length {len(password)} is out "
                "of range (allowed 8..256 characters, no ',')"
            )
        if not _printable_ascii(password):
            # Flower compares credentials with hmac.compare_digest on str, which raises on
            # non-ASCII text: every login would answer 500 instead of 200/401.
            raise InvalidInput(
                f"{name} entry {index} (user {user!r}): the password must be printable ASCII "
                "(allowed: characters 0x21..0x7e except ',')"
            )
        entries.append(f"{user}:{password}")
    return tuple(entries)


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
