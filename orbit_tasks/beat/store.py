"""Every SQL statement of the beat leader's lease (issue 30 item 3): take or renew it with one
compare-and-set, record a tick, read it for the exporter and the CLI."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from sqlalchemy import Connection, and_, case, null, or_, select, update
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from orbit_tasks.db.engine import Clock, is_mysql
from orbit_tasks.db.platform_tables import beat_leaders as t

#: The one schedule a deployment's beats lead (a row per schedule keeps room for more).
SCHEDULE = "beat"
_NOBODY = bytes(16)
_NEVER = dt.datetime(1970, 1, 1)


class Leader(NamedTuple):
    holder: str
    lease_id: bytes
    epoch: int
    lease_until: dt.datetime
    acquired_at: dt.datetime
    last_tick_at: dt.datetime | None
    now: dt.datetime  # the database clock when read


def _ensure_row(conn: Connection) -> None:
    values = {
        "name": SCHEDULE,
        "holder": "",
        "lease_id": _NOBODY,
        "epoch": 0,
        "lease_until": _NEVER,
        "acquired_at": _NEVER,
    }
    stmt: Any
    if is_mysql(conn):
        stmt = mysql_insert(t).values(values).prefix_with("IGNORE")
    else:
        stmt = sqlite_insert(t).values(values).on_conflict_do_nothing(index_elements=[t.c.name])
    conn.execute(stmt)


def take_or_renew(
    conn: Connection, clock: Clock, *, holder: str, lease_id: bytes, lease: int
) -> bool:
    """Renew the lease held by ``lease_id``, or take it when it expired (``lease_until < now``
    strictly, as job leases): one compare-and-set; True when this beat leads now. A change of
    leader adds one to ``epoch`` and sets ``acquired_at``."""
    _ensure_row(conn)
    mine = t.c.lease_id == lease_id
    result = conn.execute(
        update(t)
        .where(and_(t.c.name == SCHEDULE, or_(mine, t.c.lease_until < clock.sql())))
        # MySQL assigns left to right, a later SET seeing the earlier ones: lease_id last, so
        # that every CASE above still compares the row's old lease_id.
        .ordered_values(
            (t.c.holder, holder),
            (t.c.lease_until, clock.sql(lease)),
            (t.c.epoch, _case(mine, t.c.epoch, t.c.epoch + 1)),
            (t.c.acquired_at, _case(mine, t.c.acquired_at, clock.sql())),
            (t.c.last_tick_at, _case(mine, t.c.last_tick_at, None)),
            (t.c.lease_id, lease_id),
        )
    )
    return result.rowcount == 1


def _case(cond: Any, same: Any, other: Any) -> Any:
    return case((cond, same), else_=null() if other is None else other)


def record_tick(conn: Connection, clock: Clock, *, lease_id: bytes) -> bool:
    """The leader sent a tick: ``last_tick_at`` = now, fenced by its lease (False: deposed)."""
    result = conn.execute(
        update(t)
        .where(and_(t.c.name == SCHEDULE, t.c.lease_id == lease_id))
        .values(last_tick_at=clock.sql())
    )
    return result.rowcount == 1


def resign(conn: Connection, clock: Clock, *, lease_id: bytes) -> None:
    """A leader that stops hands the lease back at once (a standby takes it at its next look)."""
    conn.execute(
        update(t)
        .where(and_(t.c.name == SCHEDULE, t.c.lease_id == lease_id))
        .values(lease_until=_NEVER)
    )


def read(conn: Connection, clock: Clock) -> Leader | None:
    """The lease as it stands, with the database clock (None before any beat ran)."""
    row = conn.execute(
        select(
            t.c.holder,
            t.c.lease_id,
            t.c.epoch,
            t.c.lease_until,
            t.c.acquired_at,
            t.c.last_tick_at,
        ).where(t.c.name == SCHEDULE)
    ).first()
    if row is None:
        return None
    return Leader(*row, now=clock.now(conn))
