"""``orbit sender list``: outbox rows in (namespace, operation) order, keyset-paginated."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields

from sqlalchemy import select
from sqlalchemy.engine import Connection

from orbit_tasks.db.business_tables import sender_outbox, sender_resolutions
from orbit_tasks.db.keyset import after_key
from orbit_tasks.sender.policy import OutboxState
from orbit_tasks.sender.store.dead_letters import current_resolution
from orbit_tasks.sender.store.rows import values

o = sender_outbox
r = sender_resolutions


@dataclass(frozen=True, kw_only=True)
class ListedRow:
    """What ``sender list`` shows of an outbox row."""

    namespace_id: str
    operation_id: str
    queue_id: str
    state: str
    last_code: str
    send_count: int
    wake_at: dt.datetime | None
    send_deadline_at: dt.datetime
    task_id: str | None
    updated_at: dt.datetime


LIST_COLUMNS = tuple(f.name for f in fields(ListedRow))


def list_rows(
    conn: Connection,
    *,
    state: str | None,
    namespace_id: str | None,
    limit: int,
    after: tuple[str, str] | None,
    unresolved: bool = False,
) -> list[ListedRow]:
    """Rows in (namespace, operation) order, keyset-paginated after ``after``; ``unresolved``:
    only REVIEW rows without a current resolution (``sender list --unresolved``)."""
    stmt = select(*(o.c[name] for name in LIST_COLUMNS))
    if unresolved:
        stmt = (
            stmt.select_from(o.outerjoin(r, current_resolution()))
            .where(o.c.state == OutboxState.REVIEW)
            .where(r.c.namespace_id.is_(None))
        )
    if state is not None:
        stmt = stmt.where(o.c.state == state)
    if namespace_id is not None:
        stmt = stmt.where(o.c.namespace_id == namespace_id)
    if after is not None:
        stmt = stmt.where(after_key((o.c.namespace_id, o.c.operation_id), after))
    stmt = stmt.order_by(o.c.namespace_id, o.c.operation_id).limit(limit)
    return values(ListedRow, conn.execute(stmt))
