"""Retention of the outbox (docs/sender.md "Retention"): the page scan in primary-key order, the
delete of rows as seen and their compact records (``sender_pruned``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, delete, insert, or_, select
from sqlalchemy.engine import Connection

from orbit_tasks.db.business_tables import (
    sender_jobs,
    sender_outbox,
    sender_pruned,
    sender_resolutions,
)
from orbit_tasks.sender.store.rows import one_operation, page_after, values

o = sender_outbox
j = sender_jobs
p = sender_pruned
r = sender_resolutions


@dataclass(frozen=True, kw_only=True)
class PrunedRow:
    """The compact record of a pruned operation (one ``sender_pruned`` row)."""

    namespace_id: str
    operation_id: str
    queue_id: str
    request_digest: bytes
    source_ref_digest: bytes | None
    state: str
    last_code: str
    task_id: str | None
    created_at: dt.datetime
    send_deadline_at: dt.datetime
    accepted_at: dt.datetime | None
    pruned_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class ScannedRow:
    """An outbox row as a prune page read it, with what its compact record keeps."""

    namespace_id: str
    operation_id: str
    queue_id: str
    state: str
    last_code: str
    lease_epoch: int
    request_digest: bytes
    task_id: str | None
    created_at: dt.datetime
    send_deadline_at: dt.datetime
    updated_at: dt.datetime
    source_ref: str | None  # the sender_jobs reference
    review_since: dt.datetime | None  # the row's resolution, if any
    resolved_at: dt.datetime | None
    already_pruned_at: dt.datetime | None  # the operation has a compact record already


def get_pruned(
    conn: Connection, namespace_id: str, operation_id: str, latest: bool = False
) -> PrunedRow | None:
    """The compact record of a pruned operation, or None (``latest``: :func:`rows.newest`)."""
    return one_operation(conn, p, PrunedRow, namespace_id, operation_id, latest=latest)


def prune_scan_query(namespace_id: str | None, after: tuple[str, str] | None, limit: int) -> Any:
    """The next ``limit`` outbox rows in primary-key order (whatever their state: a page reads
    exactly that many rows, no index on state is needed), with what a compact record keeps:
    the ``sender_jobs`` reference and the row's resolution, and whether the operation already
    has a compact record (``already_pruned_at``; all three by primary key)."""
    return (
        select(
            o.c.namespace_id,
            o.c.operation_id,
            o.c.queue_id,
            o.c.state,
            o.c.last_code,
            o.c.lease_epoch,
            o.c.request_digest,
            o.c.task_id,
            o.c.created_at,
            o.c.send_deadline_at,
            o.c.updated_at,
            j.c.source_ref,
            r.c.review_since,
            r.c.resolved_at,
            p.c.pruned_at.label("already_pruned_at"),
        )
        .select_from(
            o.outerjoin(
                j, and_(j.c.namespace_id == o.c.namespace_id, j.c.operation_id == o.c.operation_id)
            )
            .outerjoin(
                r, and_(r.c.namespace_id == o.c.namespace_id, r.c.operation_id == o.c.operation_id)
            )
            .outerjoin(
                p, and_(p.c.namespace_id == o.c.namespace_id, p.c.operation_id == o.c.operation_id)
            )
        )
        .where(*page_after(after, namespace_id))
        .order_by(o.c.namespace_id, o.c.operation_id)
        .limit(limit)
    )


def prune_scan(
    conn: Connection, namespace_id: str | None, after: tuple[str, str] | None, limit: int
) -> list[ScannedRow]:
    return values(ScannedRow, conn.execute(prune_scan_query(namespace_id, after, limit)))


@functools.lru_cache(maxsize=256)
def _prune_delete(n: int) -> Any:
    """DELETE of ``n`` rows of one namespace, each fenced by what the scan saw (state, epoch,
    ``updated_at``: any write since changes one of them), in the expanded primary-key form."""
    as_seen = or_(
        *(
            and_(
                o.c.operation_id == bindparam(f"op{i}"),
                o.c.state == bindparam(f"st{i}"),
                o.c.lease_epoch == bindparam(f"ep{i}"),
                o.c.updated_at == bindparam(f"up{i}", type_=o.c.updated_at.type),
            )
            for i in range(n)
        )
    )
    # The IN list names the primary-key points (the optimizer takes the OR of row fences alone
    # for a range of ix_sender_due's namespace prefix on a small table).
    points = o.c.operation_id.in_([bindparam(f"op{i}") for i in range(n)])
    return delete(o).where(o.c.namespace_id == bindparam("ns"), points, as_seen)


def delete_pruned(conn: Connection, namespace_id: str, seen: list[ScannedRow]) -> bool:
    """Delete the outbox rows ``seen`` (one namespace) as seen. True when every row matched;
    otherwise the caller must roll back and prune them one by one."""
    params: dict[str, Any] = {"ns": namespace_id}
    for i, row in enumerate(seen):
        params[f"op{i}"], params[f"st{i}"] = row.operation_id, row.state
        params[f"ep{i}"], params[f"up{i}"] = row.lease_epoch, row.updated_at
    return bool(conn.execute(_prune_delete(len(seen)), params).rowcount == len(seen))


def insert_pruned(conn: Connection, records: list[PrunedRow]) -> None:
    """The compact records of rows deleted in the same transaction."""
    if records:
        conn.execute(insert(p), [dataclasses.asdict(record) for record in records])
