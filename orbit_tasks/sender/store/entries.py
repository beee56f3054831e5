"""The outbox row and its business row (``sender_outbox``, ``sender_jobs``): the insert of
``enqueue()`` and the reads of one operation."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import insert
from sqlalchemy.engine import Connection

from orbit_tasks.db.business_tables import sender_jobs, sender_outbox
from orbit_tasks.sender import policy
from orbit_tasks.sender.policy import OutboxState
from orbit_tasks.sender.store.rows import one_operation

o = sender_outbox
j = sender_jobs


@dataclass(frozen=True, kw_only=True)
class OutboxRow:
    """One ``sender_outbox`` row, every column."""

    namespace_id: str
    queue_id: str
    operation_id: str
    idempotency_key: str
    request_json: str
    request_digest: bytes
    state: str
    send_count: int
    lease_epoch: int
    wake_at: dt.datetime | None
    send_deadline_at: dt.datetime
    last_code: str
    task_id: str | None
    receipt_json: str | None
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class JobRow:
    """One ``sender_jobs`` row: the operation's business reference and its platform task."""

    namespace_id: str
    operation_id: str
    source_ref: str
    task_id: str | None
    created_at: dt.datetime
    updated_at: dt.datetime


def get_row(
    conn: Connection, namespace_id: str, operation_id: str, latest: bool = False
) -> OutboxRow | None:
    """The outbox row of (namespace, operation), or None (``latest``: :func:`rows.newest`)."""
    return one_operation(conn, o, OutboxRow, namespace_id, operation_id, latest=latest)


def get_job(
    conn: Connection, namespace_id: str, operation_id: str, latest: bool = False
) -> JobRow | None:
    return one_operation(conn, j, JobRow, namespace_id, operation_id, latest=latest)


def lock_row(conn: Connection, namespace_id: str, operation_id: str) -> OutboxRow | None:
    """The outbox row, newest committed, locked until the transaction ends (``FOR UPDATE``;
    SQLite: the transaction's write lock). Every dead-letter command locks the row before it
    decides (requeue, resolve), so that a resolve and a requeue of one row are one after the
    other: a resolved row is never requeued in bulk, a requeued row never reported resolved."""
    return one_operation(conn, o, OutboxRow, namespace_id, operation_id, lock=True)


def insert_entry(
    conn: Connection,
    *,
    namespace_id: str,
    queue_id: str,
    operation_id: str,
    request_json: str,
    request_digest: bytes,
    source_ref: str,
    now: dt.datetime,
) -> None:
    """The outbox row and its business row, in the caller's transaction."""
    conn.execute(
        insert(j).values(
            namespace_id=namespace_id,
            operation_id=operation_id,
            source_ref=source_ref,
            task_id=None,
            created_at=now,
            updated_at=now,
        )
    )
    conn.execute(
        insert(o).values(
            namespace_id=namespace_id,
            queue_id=queue_id,
            operation_id=operation_id,
            idempotency_key=policy.idempotency_key(operation_id),
            request_json=request_json,
            request_digest=request_digest,
            state=OutboxState.PENDING,
            send_count=0,
            lease_epoch=0,
            wake_at=now,
            send_deadline_at=now + policy.SEND_WINDOW,
            last_code=policy.LastCode.NEW,
            task_id=None,
            receipt_json=None,
            created_at=now,
            updated_at=now,
        )
    )
