"""Every SQL statement of queue holds (``sender_holds``, revision b0003; issue 23 item 4).

A 429 or 503 with ``Retry-After`` holds its whole (namespace, queue): the pass that records the
answer writes the hold here, bounded (policy.hold_until), and every sender process skips the
queue's claims until ``held_until`` (database clock). ``sender show`` and the exporter read it.
One row per queue; a later answer replaces it; an expired row is inert.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Connection

from orbit_tasks.db.business_tables import sender_holds, sender_outbox
from orbit_tasks.db.engine import is_mysql

h = sender_holds
o = sender_outbox


def earliest_open_deadline(
    conn: Connection, namespace_id: str, queue_id: str
) -> dt.datetime | None:
    """The earliest ``send_deadline_at`` of the queue's PENDING and SENDING rows (the rows with a
    ``wake_at``: a range of ``ix_sender_due``, never the queue's finished rows)."""
    return conn.execute(
        select(func.min(o.c.send_deadline_at)).where(
            o.c.namespace_id == namespace_id,
            o.c.queue_id == queue_id,
            o.c.wake_at.is_not(None),
        )
    ).scalar_one()


def write_hold(
    conn: Connection,
    namespace_id: str,
    queue_id: str,
    *,
    until: dt.datetime,
    status: int,
    asked_seconds: float,
    now: dt.datetime,
) -> None:
    """Record (or replace) the hold of one queue."""
    values = dict(
        namespace_id=namespace_id,
        queue_id=queue_id,
        held_until=until,
        status=status,
        asked_seconds=math.ceil(asked_seconds),
        set_at=now,
    )
    changed = {k: v for k, v in values.items() if k not in ("namespace_id", "queue_id")}
    stmt: Any
    if is_mysql(conn):
        stmt = mysql.insert(h).values(**values).on_duplicate_key_update(**changed)
    else:
        stmt = (
            sqlite.insert(h)
            .values(**values)
            .on_conflict_do_update(index_elements=["namespace_id", "queue_id"], set_=changed)
        )
    conn.execute(stmt)


def held_queues(conn: Connection, namespace_id: str, now: dt.datetime) -> dict[str, dt.datetime]:
    """queue -> ``held_until`` of the namespace's holds still running at ``now``."""
    rows = conn.execute(
        select(h.c.queue_id, h.c.held_until).where(
            h.c.namespace_id == namespace_id, h.c.held_until > now
        )
    )
    return {str(q): until for q, until in rows}


def get_hold(conn: Connection, namespace_id: str, queue_id: str) -> Any:
    """The hold row of one queue (running or expired), or None."""
    return conn.execute(
        select(h).where(h.c.namespace_id == namespace_id, h.c.queue_id == queue_id)
    ).first()


def running_holds(conn: Connection, now: dt.datetime) -> list[Any]:
    """Every hold still running at ``now`` (the exporter's gauge)."""
    return list(conn.execute(select(h).where(h.c.held_until > now)))
