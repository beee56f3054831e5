"""The start check of the session bounds (docs/operations.md "Partitions and frozen nodes").

Workers, beat, the API and the exporter read back, on one connection, the session variables
that :mod:`orbit_tasks.db.session_bounds` sets at connect. Where the server did not take them (a
server without the variable, a proxy that drops ``SET`` statements, an ``init_connect`` or a
privilege rule that overrides them), a node cut off inside a write transaction would hold its
rows past the lease: the process says so in one warning line and starts anyway.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine, text

from orbit_tasks.db.engine import BOUNDS_ATTR, is_mysql
from orbit_tasks.db.session_bounds import SessionBounds, server_of, session_variables, unmet
from orbit_tasks.logs import log_action
from orbit_tasks.redaction import redact_url

logger = logging.getLogger("orbit.db.session_check")


def unmet_bounds(engine: Engine) -> list[tuple[str, int | None, int]]:
    """The session bounds not in force on a new connection of ``engine`` (empty on SQLite and
    for an engine made without bounds)."""
    bounds: SessionBounds | None = getattr(engine, BOUNDS_ATTR, None)
    if bounds is None or not is_mysql(engine):
        return []
    with engine.connect() as conn:
        server = server_of(str(conn.execute(text("SELECT VERSION()")).scalar_one()))
        names = [n for n, v in session_variables(bounds, server).items() if isinstance(v, int)]
        observed: dict[str, int | None] = {}
        for name in names:
            try:
                value = conn.execute(text(f"SELECT @@session.{name}")).scalar_one()
            except Exception:  # noqa: BLE001 - a server without the variable
                conn.rollback()
                value = None
            observed[name] = None if value is None else int(value)
    return unmet(bounds, server, observed)


def warn_unless_bounded(engine: Engine, database: str) -> bool:
    """One WARNING line when a bound is not in force; returns whether all are."""
    problems = unmet_bounds(engine)
    if not problems:
        return True
    shown = ", ".join(
        f"{name}={'missing' if seen is None else seen} (wanted 1..{want})"
        for name, seen, want in problems
    )
    log_action(
        logger,
        "db.session.unbounded",
        logging.WARNING,
        database=database,
        url=redact_url(engine.url.render_as_string(hide_password=False)),
        unmet=shown,
        runbook='docs/operations.md "Partitions and frozen nodes"',
    )
    return False
