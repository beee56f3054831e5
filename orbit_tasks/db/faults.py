"""Which database errors are transient (retry later) and which are real failures.

SPEC §5: "Transient faults (database or broker unreachable, deadlock, lock wait timeout) are not
job failures". A CHECK violation (MariaDB 4025) or a missing table is *not* transient: retrying
would only hide a bug until the stall guard fires.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError

# MySQL/MariaDB server codes that mean "try again later"; 2000-2999 are client-library errors
# (cannot connect, lost connection, server gone away) and are all transient.
TRANSIENT_SERVER_CODES = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1077, 1078, 1079, 1080, 1081,  # shutdown / forcing close / socket errors
        1152, 1158, 1159, 1160, 1161,  # aborted connection, network read/write errors
        1203, 1226,  # max user connections, resource limit
        1205,  # lock wait timeout
        1213,  # deadlock
        1290, 1792, 1836,  # read-only (during failover)
        1317,  # query interrupted
        1927,  # MariaDB: connection was killed
        3024,  # query execution time exceeded
        4031,  # MySQL 8: disconnected by the server for idleness
    }
)  # fmt: skip


# Lock conflicts: the transaction lost a race (deadlock: running it again right away usually
# succeeds) or met a row another session holds (lock wait timeout: try later).
LOCK_WAIT_TIMEOUT = 1205
DEADLOCK = 1213
LOCK_CONFLICT_CODES = frozenset({LOCK_WAIT_TIMEOUT, DEADLOCK})


def is_lock_conflict(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError) and driver_code(exc) in LOCK_CONFLICT_CODES


def driver_code(exc: BaseException) -> Any:
    """The DB-API error's first argument (the MySQL error number), or None."""
    args = getattr(getattr(exc, "orig", None), "args", None)
    return args[0] if args else None


def is_transient_db(exc: BaseException) -> bool:
    if isinstance(exc, DisconnectionError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError):
        return False
    code = driver_code(exc)
    if isinstance(code, int):
        return code in TRANSIENT_SERVER_CODES or 2000 <= code < 3000
    text = str(code or "")
    # SQLite: "database is locked" / "unable to open" are transient; schema errors are not.
    return "no such table" not in text and "no such column" not in text
