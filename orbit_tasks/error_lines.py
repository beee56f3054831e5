"""What the operator reads when a command fails: one line and an exit code per exception (SPEC §9,
docs/cli.md). Pure: takes the exception, returns ``(message, exit code)``.

Lines name the value, path, table or driver code and what is wrong; never SQL text, bound
parameters, tokens or passwords (they may hold business data or secrets).
"""

from __future__ import annotations

import re

import click
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError

from orbit_tasks import oserrors
from orbit_tasks.db.engine import SETTING_ATTR
from orbit_tasks.db.faults import LOCK_CONFLICT_CODES
from orbit_tasks.errors import Command, OrbitError
from orbit_tasks.redaction import redact_url

# MySQL client/server codes that mean "cannot reach or use the server", not "bad statement".
_UNAVAILABLE_CODES = {1040, 1053, 2002, 2003, 2005, 2006, 2013, 2055}
_ACCESS_DENIED_CODES = {1044, 1045, 1698}
_UNKNOWN_DATABASE = 1049
_MYSQL_NO_SUCH_TABLE = 1146
_MYSQL_TABLE = re.compile(r"Table '(?:[^'.]*\.)?([^'.]+)' doesn't exist")
_SQLITE_TABLE = re.compile(r"no such table: (?:\w+\.)?(\w+)")
# The business database's tables all start with this prefix (db/business_tables.py).
BUSINESS_TABLE_PREFIX = "sender_"


# How the CLI words the fields that stores and rules name (orbit_tasks/errors.py).
FIELD_FLAGS = {
    "storage_id": "--storage",
    "interval_seconds": "--interval",
    "batch_size": "--batch-size",
    "max_bytes": "--max-bytes",
    "policy_revision": "--policy-revision",
    "expect_revision": "--expect-revision",
    "archive_after_seconds": "--archive-after",
    "after": "--after",
    "limit": "--limit",
    "max_roots_per_second": "--max-roots-per-second",
    "reason": "--reason",
    "from_": "--from",
    "until": "--until",
    "volumes": "--volume",
    "settled_from": "--settled-from",
    "settled_until": "--settled-until",
    "out": "--out",
    "force": "--force",
}

# How the CLI spells the commands that errors point to (orbit_tasks/errors.py ``Command``).
COMMANDS = {
    Command.STORAGE_LIST: "orbit storage list",
    Command.POLICY_SET: "orbit policy set NS {kind} --archive-after DURATION",
    Command.PLAN_ENABLE: "orbit plan set NS KIND --enable",
    Command.PLAN_CONFIRM_POLICY: "orbit plan set --policy-revision",
    Command.JOB_SHOW: "orbit job show",
    Command.JOB_LIST: "'orbit job list'",
}


def describe_error(exc: Exception, broker_url: str | None = None) -> tuple[str, int]:
    """The operator's line (without ``error: ``) and the exit code for ``exc``; the fields an
    error names are worded as the CLI's flags, the command it points to as the CLI's command.
    ``broker_url``: the broker the command used, named (redacted) when the broker failed."""
    if isinstance(exc, OrbitError):
        return exc.worded(FIELD_FLAGS, COMMANDS), exc.exit_code
    if isinstance(exc, DBAPIError):
        setting = getattr(exc, SETTING_ATTR, None)
        where = "" if setting is None else f" [{setting}]"
        return describe_database_error(exc) + where, 1
    if isinstance(exc, NoSuchModuleError):
        return f"a database plugin cannot be loaded ({_first_line(exc)})", 1
    if isinstance(exc, ArgumentError):
        return f"database configuration refused ({_first_line(exc)})", 1
    if isinstance(exc, ImportError):
        return f"the module {exc.name!r} cannot be loaded (is its package installed?)", 1
    if isinstance(exc, OSError):
        return describe_os_error(exc), 1
    if _is_broker_error(exc):
        return describe_broker_error(exc, broker_url), 1
    return (
        f"unexpected {type(exc).__name__}; rerun with ORBIT_LOG_LEVEL=DEBUG for the traceback",
        1,
    )


def describe_broker_error(exc: Exception, broker_url: str | None) -> str:
    """``message broker unavailable (OperationalError) [CELERY_BROKER_URL 'amqp://***@mq:5672//']``:
    like a database's line, the setting and its URL with user info, query and fragment hidden."""
    where = (
        "CELERY_BROKER_URL"
        if broker_url is None
        else f"CELERY_BROKER_URL {redact_url(broker_url)!r}"
    )
    return f"message broker unavailable ({type(exc).__name__}) [{where}]"


def describe_usage_error(exc: click.ClickException) -> tuple[str, int]:
    """Click's own refusal (a bad option value, a value out of its range or choices, a missing
    option or argument, an unknown command) as the one line of docs/cli.md, without click's
    usage block: ``invalid value for '--port': 0 is not in the range 1<=x<=65535``. Exit 2 for
    usage errors (click's ``exit_code``)."""
    lines = [line.strip() for line in exc.format_message().splitlines() if line.strip()]
    text = "; ".join(lines) or type(exc).__name__
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        text = text[0].lower() + text[1:]
    return text.removesuffix("."), exc.exit_code


def describe_os_error(exc: OSError) -> str:
    """``/path: read-only file system (EROFS)`` (both paths of a rename or link)."""
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    where = " -> ".join(names)
    return f"{where}: {oserrors.reason(exc)}" if where else oserrors.reason(exc)


def missing_table(exc: DBAPIError) -> str | None:
    """The table a statement found missing (MariaDB/MySQL 1146, SQLite "no such table")."""
    args: tuple[object, ...] = tuple(getattr(exc.orig, "args", ()))
    if len(args) >= 2 and args[0] == _MYSQL_NO_SUCH_TABLE:
        match = _MYSQL_TABLE.search(str(args[1]))
    elif args and isinstance(args[0], str):
        match = _SQLITE_TABLE.search(args[0])
    else:
        return None
    return match.group(1) if match else None


def missing_table_hint(table: str) -> str:
    """Which upgrade creates ``table``: ``sender_*`` tables live in the business database."""
    if table.startswith(BUSINESS_TABLE_PREFIX):
        return f"the business database has no table {table}: run `orbit sender db upgrade`"
    return f"the platform database has no table {table}: run `orbit db upgrade`"


def describe_database_error(exc: DBAPIError) -> str:
    table = missing_table(exc)
    if table is not None:
        return missing_table_hint(table)
    if isinstance(exc, OperationalError):
        return describe_operational_error(exc)
    if "file is not a database" in _first_arg(exc):
        return "the file is not a SQLite database"
    code = _driver_code(exc)
    suffix = "" if code is None else f", driver code {code}"
    return f"database refused the change ({type(exc.orig).__name__}{suffix})"


def describe_operational_error(exc: OperationalError) -> str:
    code = _driver_code(exc)
    if code is not None:
        if code in _UNAVAILABLE_CODES:
            return f"database unavailable (driver code {code})"
        if code in _ACCESS_DENIED_CODES:
            return f"database access denied: check the user and password (driver code {code})"
        if code == _UNKNOWN_DATABASE:
            return f"the database named in the URL does not exist (driver code {code})"
        if code == 4025:
            return "database refused the change: a CHECK constraint failed (driver code 4025)"
        if code in LOCK_CONFLICT_CODES:
            return f"database busy (lock wait or deadlock, driver code {code}); retry"
        return f"database error (driver code {code})"
    text = _first_arg(exc)
    if "locked" in text:
        return "database busy (SQLite file locked); retry"
    if "unable to open" in text:
        return "database unavailable (cannot open the SQLite file)"
    return f"database error ({type(exc.orig).__name__})"


def _driver_code(exc: DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _first_arg(exc: DBAPIError) -> str:
    args = getattr(exc.orig, "args", ())
    return str(args[0]) if args else ""


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]


def _is_broker_error(exc: Exception) -> bool:
    # Imported here: kombu (~0.04 s) only when an error is described, not at every `orbit` start.
    from kombu.exceptions import OperationalError as BrokerOperationalError

    return isinstance(exc, BrokerOperationalError)
