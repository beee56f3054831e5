"""How the sender's stores read rows: as typed frozen values, one operation's row (the newest
committed one on request), and a page after a key of the outbox's primary key."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Table, select
from sqlalchemy.engine import Connection, Row

from orbit_tasks.db.business_tables import sender_outbox
from orbit_tasks.db.keyset import after_key

o = sender_outbox
V = TypeVar("V")


def value(cls: type[V], row: Row[Any]) -> V:
    """The frozen value ``cls`` of ``row`` (its fields named as the selected columns); binary
    columns become ``bytes`` whatever the driver returned."""
    return cls(
        **{
            k: bytes(v) if isinstance(v, bytearray | memoryview) else v
            for k, v in row._mapping.items()
        }
    )


def values(cls: type[V], rows: Any) -> list[V]:
    return [value(cls, row) for row in rows]


def newest(stmt: Any, latest: bool) -> Any:
    """``latest``: a locking read (``LOCK IN SHARE MODE`` on MySQL/MariaDB), which reads the
    newest committed row whatever the caller's isolation level; a plain read under REPEATABLE
    READ keeps the snapshot of the transaction's first read (SQLite: a plain read)."""
    return stmt.with_for_update(read=True) if latest else stmt


def one_operation(
    conn: Connection,
    table: Table,
    cls: type[V],
    namespace_id: str,
    operation_id: str,
    *,
    latest: bool = False,
    lock: bool = False,
) -> V | None:
    """The row of (namespace, operation) of ``table`` as a ``cls``, or None. ``latest``: see
    :func:`newest`; ``lock``: ``FOR UPDATE`` (locked until the transaction ends)."""
    c = table.c
    stmt = select(table).where(c.namespace_id == namespace_id, c.operation_id == operation_id)
    stmt = stmt.with_for_update() if lock else newest(stmt, latest)
    found = conn.execute(stmt).first()
    return None if found is None else value(cls, found)


def page_after(
    after: tuple[str, str] | None, namespace_id: str | None
) -> list[ColumnElement[bool]]:
    """The conditions of a page of outbox rows after ``after`` on the primary key: the keyset
    ``ns > :ns OR (ns = :ns AND op > :op)``, or ``ns = :ns AND op > :op`` inside one namespace."""
    where: list[ColumnElement[bool]] = []
    if namespace_id is not None:
        where.append(o.c.namespace_id == namespace_id)
        if after is not None:
            where.append(o.c.operation_id > after[1])
    elif after is not None:
        where.append(after_key((o.c.namespace_id, o.c.operation_id), after))
    return where
