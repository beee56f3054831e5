"""How long a database session may wait or sit silent, derived from the lease (pure; SPEC §5,
docs/operations.md "Partitions and frozen nodes").

A row lock belongs to a server session, not to a lease: a client that is cut off or frozen
(``SIGSTOP``, a paused VM) inside a write transaction keeps its rows locked for as long as the
server waits for it, which is ``wait_timeout`` (8 hours by default). Every session of a worker,
beat, the API and the CLI therefore sets, at connect, bounds below the lease of the work that uses
that database (the archive lease for the platform database, the sender lease for the business
database):

==========================  ===========================================  =======================
bound                       MariaDB 10.3+                                MySQL 8
==========================  ===========================================  =======================
idle inside a transaction   ``idle_transaction_timeout`` (the server     ``wait_timeout`` (MySQL
                            rolls back and closes the session)           has no transaction-only
                                                                         bound: any idle session)
lock wait                   ``innodb_lock_wait_timeout``                 same
client connect / read /     mysqlclient ``connect_timeout``,             same
write                       ``read_timeout``, ``write_timeout``
==========================  ===========================================  =======================

With ``L`` the lease in seconds::

    idle transaction  = clamp(L // 4, 1, 30)   lease 4 -> 1, lease 8 -> 2, lease 120 -> 30
    lock wait         = clamp(L // 8, 1, 5)    below every Celery soft limit the lease allows
    connect           = clamp(L // 4, 1, 10)
    read / write      = clamp(L // 2, 2, 60)   above the lock wait: a lock wait ends first
    SQLite busy wait  = clamp(L // 4, 1, 30)   (no server: the embedded default's bound)

So a silent holder's transaction is rolled back before its lease ends, a takeover that meets its
lock gives up after the lock wait ("not mine now, try later") instead of being killed by the hard
limit, and a worker on a blackholed network gets an error from its own socket before the kernel's
retransmissions (about 15 minutes) would give up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Server = Literal["mariadb", "mysql"]


def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


@dataclass(frozen=True)
class SessionBounds:
    idle_transaction_seconds: int
    lock_wait_seconds: int
    connect_seconds: int
    io_seconds: int | None  # client read/write timeout; None: unbounded (schema upgrades)
    sqlite_busy_seconds: int

    def without_io_bound(self) -> SessionBounds:
        """The same bounds with no client read/write timeout (``db upgrade``: a migration may
        run one long statement)."""
        return SessionBounds(
            self.idle_transaction_seconds,
            self.lock_wait_seconds,
            self.connect_seconds,
            None,
            self.sqlite_busy_seconds,
        )


def bounds_for_lease(lease_seconds: int) -> SessionBounds:
    """The bounds of every session of a database whose work holds leases of ``lease_seconds``."""
    if lease_seconds < 1:
        raise ValueError(f"lease {lease_seconds} s is out of range (allowed >= 1)")
    return SessionBounds(
        idle_transaction_seconds=_clamp(lease_seconds // 4, 1, 30),
        lock_wait_seconds=_clamp(lease_seconds // 8, 1, 5),
        connect_seconds=_clamp(lease_seconds // 4, 1, 10),
        io_seconds=_clamp(lease_seconds // 2, 2, 60),
        sqlite_busy_seconds=_clamp(lease_seconds // 4, 1, 30),
    )


def session_variables(bounds: SessionBounds | None, server: Server) -> dict[str, int | str]:
    """The session variables set at connect, in order (the UTC session first)."""
    values: dict[str, int | str] = {"time_zone": "+00:00"}
    if bounds is None:
        return values
    values["innodb_lock_wait_timeout"] = bounds.lock_wait_seconds
    if server == "mariadb":
        values["idle_transaction_timeout"] = bounds.idle_transaction_seconds
    else:
        values["wait_timeout"] = bounds.idle_transaction_seconds
    return values


def session_statement(bounds: SessionBounds | None, server: Server) -> str:
    """One ``SET SESSION`` for every variable (one round trip at connect)."""
    parts = []
    for name, value in session_variables(bounds, server).items():
        shown = f"'{value}'" if isinstance(value, str) else str(value)
        parts.append(f"{name} = {shown}")
    return "SET SESSION " + ", ".join(parts)


def server_of(version: str) -> Server:
    """``mariadb`` or ``mysql`` from the server's version string (``10.11.6-MariaDB-...``)."""
    return "mariadb" if "mariadb" in version.lower() else "mysql"


def connect_args(bounds: SessionBounds | None) -> dict[str, int]:
    """mysqlclient's client-side socket timeouts."""
    if bounds is None:
        return {}
    args = {"connect_timeout": bounds.connect_seconds}
    if bounds.io_seconds is not None:
        args.update(read_timeout=bounds.io_seconds, write_timeout=bounds.io_seconds)
    return args


def unmet(
    bounds: SessionBounds, server: Server, observed: dict[str, int | None]
) -> list[tuple[str, int | None, int]]:
    """The bounds not in force in a session: ``(variable, value seen, value wanted)`` for each
    variable that is missing (None), unbounded (0) or above what ``bounds`` asks."""
    wanted = {k: v for k, v in session_variables(bounds, server).items() if isinstance(v, int)}
    problems = []
    for name, want in wanted.items():
        seen = observed.get(name)
        if seen is None or seen == 0 or seen > want:
            problems.append((name, seen, want))
    return problems
