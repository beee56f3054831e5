"""Structured logs with a stable ``action`` key (``archive.job.claimed``, ``sender.row.accepted``)
and the one log configuration of every orbit process (SPEC §12 "Logs").

Fields are ids, counts, codes and states only: never tokens, request bodies or file contents.
``ORBIT_LOG_FORMAT=json`` writes one JSON object per line (``ts`` UTC with ``Z``, ``level``,
``logger``, ``action`` or ``message``, then the fields) for orbit's records and for those of
Celery, uvicorn and Flower alike; ``text`` (the default) writes one plain line per record. Both
pass every line through :func:`redact`, a safety net for known secret shapes that slipped into
a message (a token in an exception text, a URL with a password).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import IO, Any

from orbit_tasks.redaction import redact_urls
from orbit_tasks.settings import LOG_FORMATS, get_settings
from orbit_tasks.timestamps import format_epoch

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
REDACTED = "<redacted>"

# Keys of a JSON line that a record's own fields may not overwrite.
RESERVED_KEYS = ("ts", "level", "logger", "action", "message", "exc_type", "exc")

# Known secret shapes (the safety net; the rule is still: never log a secret or a body).
_SECRET_PARAMS = (
    r"token|access_token|refresh_token|api_key|apikey|password|passwd|secret|client_secret"
)
_TOKEN_CHARS = r"[A-Za-z0-9._~+/=\-]"
_REDACTIONS: list[tuple[re.Pattern[str], Any]] = [
    # platform API tokens (orbit_tasks.platform.store.TOKEN_PREFIX)
    (re.compile(r"\borb_[A-Za-z0-9_\-]{4,}"), "orb_" + REDACTED),
    # an Authorization header or key in any quoting: keep the scheme, drop the credentials
    (
        re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)(?:(bearer|basic)\s+)?[^\s'\",;}]+"),
        lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + REDACTED,
    ),
    # a credential after its scheme (at least 8 characters, one of them not a letter)
    (
        re.compile(rf"(?i)\b(bearer|basic)\s+(?={_TOKEN_CHARS}*[0-9=+/_\-]){_TOKEN_CHARS}{{8,}}"),
        r"\1 " + REDACTED,
    ),
    # secret-looking URL, form or key=value parameters
    (re.compile(rf"(?i)((?:^|[?&;,\s])(?:{_SECRET_PARAMS})=)[^&\s'\",]+"), r"\1" + REDACTED),
    # SQLAlchemy error texts carry the statement's parameters: business content
    (re.compile(r"\[parameters: .*?\](?=\s*(?:\(|\[|$))", re.S), "[parameters: " + REDACTED + "]"),
]


def redact(text: str) -> str:
    """``text`` with every known secret shape replaced by ``<redacted>``: the user info, query
    and fragment of every URL (:func:`orbit_tasks.redaction.redact_url`), then the others."""
    text = redact_urls(text, REDACTED)
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return value


def utc_ts(created: float) -> str:
    """``2026-01-02T03:04:05.123456Z`` for a record's ``created`` time."""
    return format_epoch(created)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``action`` (action records) or
    ``message`` (all others), then the record's fields; exceptions as ``exc_type`` and ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": utc_ts(record.created),
            "level": record.levelname,
            "logger": record.name,
        }
        action = getattr(record, "action", None)
        if isinstance(action, str):
            out["action"] = action
            fields = getattr(record, "fields", None) or {}
            for key, value in fields.items():
                out[f"{key}_" if key in RESERVED_KEYS else key] = value
        else:
            out["message"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            out["exc_type"] = record.exc_info[0].__name__
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(_redact_value(out), ensure_ascii=False, default=str)


class RedactingTextFormatter(logging.Formatter):
    """The plain format (``TEXT_FORMAT``) with :func:`redact` applied to the whole line."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def make_formatter(log_format: str) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    return JsonFormatter() if log_format == "json" else RedactingTextFormatter()


class OrbitLogHandler(logging.StreamHandler[IO[str]]):
    """The one root handler. Without an explicit stream it writes to the *current*
    ``sys.stderr`` (as ``logging.lastResort`` does), so a replaced stderr (click's test runner,
    celery's redirection) never leaves it writing into a closed stream."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self._fixed = stream

    @property
    def stream(self) -> IO[str]:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        self._fixed = value


# Libraries that install their own handlers (uvicorn's dictConfig, tornado's pretty logging):
# their records go to the root handler instead, so that they share the one format.
_PROPAGATING_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "tornado", "celery")
# Loggers that are set not to propagate behind our back: billiard (Celery's prefork pool) turns
# propagation off on "multiprocessing" whenever it creates its logger again (Celery resets it at
# every logging set-up), so without a handler of its own its lines (a hard time limit's kill,
# "Process 'ForkPoolWorker-1' ... exited with 'signal 9 (SIGKILL)'", a pool process's error with
# its traceback) reached stderr raw through ``logging.lastResort``. The one handler is attached
# to them directly.
_DETACHED_LOGGERS = ("multiprocessing",)
# The AWS SDK's loggers dump whole requests at DEBUG (``botocore.endpoint``, ``botocore.auth``:
# the ``Authorization`` header with the access key id and the signature, a session token in
# ``x-amz-security-token``): never below WARNING, whatever the level (credentials are never
# logged; docs/archive-jobs.md "Object storage").
_CREDENTIAL_LOGGERS = ("botocore", "boto3", "s3transfer")


def configure_logging(
    log_format: str, level: str, *, stream: IO[str] | None = None
) -> logging.Handler:
    """Install the one root handler writing ``log_format`` lines at ``level`` to ``stream``
    (default: the current stderr). Idempotent: a handler installed earlier is replaced; handlers
    of others (pytest's capture) stay."""
    handler = OrbitLogHandler(stream)
    handler.setFormatter(make_formatter(log_format))
    root = logging.getLogger()
    for mine in [h for h in root.handlers if isinstance(h, OrbitLogHandler)]:
        root.removeHandler(mine)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _PROPAGATING_LOGGERS:
        lib = logging.getLogger(name)
        for other in list(lib.handlers):
            lib.removeHandler(other)
        lib.propagate = True
    for name in _DETACHED_LOGGERS:
        lib = logging.getLogger(name)
        for other in list(lib.handlers):
            lib.removeHandler(other)
        lib.addHandler(handler)
        lib.propagate = False  # billiard's own setting; the handler above is the one line
        # its INFO lines are per-child chatter ("child process N calling self.run()")
        lib.setLevel(max(logging.WARNING, root.level))
    for name in _CREDENTIAL_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    for name in ("orbit", "orbit_tasks"):
        # One root handler serves every logger; no own handlers or levels below it.
        own = logging.getLogger(name)
        for other in list(own.handlers):
            own.removeHandler(other)
        own.propagate = True
        own.setLevel(logging.NOTSET)
    # Alembic reports its migration context at INFO on every schema check (each start of a
    # worker, beat or the API); only its warnings are worth a line.
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.captureWarnings(True)
    return handler


def configure_from_settings(default_level: str, *, stream: IO[str] | None = None) -> None:
    """:func:`configure_logging` with ``ORBIT_LOG_FORMAT`` and ``ORBIT_LOG_LEVEL`` from the one
    Settings object; ``default_level`` applies when ``ORBIT_LOG_LEVEL`` is not set."""
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level or default_level, stream=stream)


def log_action(
    logger: logging.Logger, action: str, level: int = logging.INFO, **fields: Any
) -> None:
    """Log one event as ``action`` plus JSON fields (bytes ids are rendered as hex). Nothing is
    built when ``level`` is disabled (the archive and relay hot paths log per file and per row)."""
    if not logger.isEnabledFor(level):
        return
    clean = {k: (v.hex() if isinstance(v, bytes | bytearray) else v) for k, v in fields.items()}
    logger.log(
        level,
        "%s %s",
        action,
        json.dumps(clean, sort_keys=True, default=str),
        extra={"action": action, "fields": clean},
    )
