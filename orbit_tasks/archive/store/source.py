"""The archiver's read-only source queries (SPEC §5 step 3): ``roots_total`` of a fixed range and
the hot read -- a keyset on (settled, id) over the kind's settled index (``ix_<kind>_settled``),
written in the expanded form ``settled > :t OR (settled = :t AND id > :i)`` -- that fetches
several batches' roots at once (a *chunk*), then every child row of those roots in one query.
Nothing here ever modifies a source row.

Rows come back as tuples in the table's column order, ready for
:class:`~orbit_tasks.archive.format.lines.LineEncoder`. On MySQL/MariaDB the server spells values
exactly as the archive format does (SPEC §6): datetime columns as
``DATE_FORMAT(col, '%Y-%m-%dT%H:%i:%s.%fZ')`` and binary columns as ``LOWER(HEX(col))``. That
spares the driver's per-value datetime conversion (half of the fetch time of a history row) and
the encoder's per-value work: a row of text, integers and NULLs goes to the JSON encoder as it
is. SQLite returns datetimes and bytes, which the encoder converts itself.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, DateTime, LargeBinary, Table, and_, func, literal, or_, select

from orbit_tasks.archive.format.lines import LineEncoder
from orbit_tasks.archive.format.values import parse_ts
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.db.engine import is_mysql
from orbit_tasks.db.platform_tables import heartbeat
from orbit_tasks.platform.history import ChildSpec, HistoryKind, history_kind

#: DATE_FORMAT spelling of the archive's ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (SPEC §6).
ARCHIVE_TS_FORMAT = "%Y-%m-%dT%H:%i:%s.%fZ"

Cursor = tuple[datetime, bytes]  # (settled, id) of the last root read; the next starts after it


def _range_cond(hk: HistoryKind, ns_id: bytes, rng: ArchiveRange) -> list[Any]:
    """``from <= (settled, id) < until`` in the expanded form: a plain time bound is
    ``settled >= :from`` / ``settled < :until``, a key bound (SPEC §5 budget-sized ranges)
    ``settled > :t OR (settled = :t AND id >= :i)`` / ``settled < :t OR (settled = :t AND id <
    :i)``, so the index range stays (namespace_id, settled)."""
    settled, root_id = hk.settled, hk.root.c.id
    cond = [hk.root.c.namespace_id == ns_id]
    if rng.until_id is None:
        cond.append(settled < rng.until)
    else:
        cond.append(or_(settled < rng.until, and_(settled == rng.until, root_id < rng.until_id)))
    if rng.from_ is not None:
        if rng.from_id is None:
            cond.append(settled >= rng.from_)
        else:
            cond.append(
                or_(settled > rng.from_, and_(settled == rng.from_, root_id >= rng.from_id))
            )
    return cond


def keys_from(
    conn: Connection, kind: str, ns_id: bytes, rng: ArchiveRange, offset: int, limit: int
) -> list[tuple[datetime, bytes]]:
    """The keys (settled, id) of the range's roots number ``offset + 1`` to ``offset + limit``
    in (settled, id) order: where a range is cut to its budget (SPEC §5). The index
    (namespace_id, settled, id) is walked ``offset`` entries far, reading no row."""
    if rng.empty:
        return []
    q = keys_query(kind, ns_id, rng, offset, limit)
    return [(settled, bytes(root_id)) for settled, root_id in conn.execute(q).all()]


def keys_query(kind: str, ns_id: bytes, rng: ArchiveRange, offset: int, limit: int) -> Any:
    """The statement of :func:`keys_from`."""
    hk = history_kind(kind)
    return (
        select(hk.settled, hk.root.c.id)
        .where(*_range_cond(hk, ns_id, rng))
        .order_by(hk.settled, hk.root.c.id)
        .offset(offset)
        .limit(limit)
    )


def count_roots(conn: Connection, kind: str, ns_id: bytes, rng: ArchiveRange) -> int:
    """``roots_total`` of the manifest: roots with ``from <= settled < until``."""
    if rng.empty:
        return 0
    return int(conn.execute(count_query(kind, ns_id, rng)).scalar_one())


def count_query(kind: str, ns_id: bytes, rng: ArchiveRange) -> Any:
    """The statement of :func:`count_roots`."""
    hk = history_kind(kind)
    return select(func.count()).select_from(hk.root).where(*_range_cond(hk, ns_id, rng))


def _columns(table: Table, server_times: bool) -> list[Any]:
    """The table's columns in order; with ``server_times`` (MySQL/MariaDB) datetimes and binary
    values spelled by the server as the archive spells them."""
    if not server_times:
        return list(table.columns)
    return [_spelled(c).label(c.name) for c in table.columns]


def _spelled(column: Any) -> Any:
    if isinstance(column.type, DateTime):
        return func.date_format(column, literal(ARCHIVE_TS_FORMAT))
    if isinstance(column.type, LargeBinary):
        return func.lower(func.hex(column))
    return column


def _after(hk: HistoryKind, cursor: Cursor) -> Any:
    t, i = cursor
    return or_(hk.settled > t, and_(hk.settled == t, hk.root.c.id > i))


def roots_query(
    kind: str,
    ns_id: bytes,
    rng: ArchiveRange,
    cursor: Cursor | None,
    limit: int,
    *,
    server_times: bool = False,
) -> Any:
    """The hot root query: keyset on (settled, id) in the range, on the kind's settled index,
    ``limit`` roots (the reader asks for several batches plus one to peek)."""
    hk = history_kind(kind)
    cond = _range_cond(hk, ns_id, rng)
    if cursor is not None:
        cond.append(_after(hk, cursor))
    cols = _columns(hk.root, server_times)
    return select(*cols).where(*cond).order_by(hk.settled, hk.root.c.id).limit(limit)


def children_query(
    kind: str,
    child: ChildSpec,
    ns_id: bytes,
    rng: ArchiveRange,
    cursor: Cursor | None,
    through: Cursor,
    *,
    server_times: bool = False,
) -> Any:
    """Every row of one child table whose root lies after ``cursor`` up to ``through``
    (inclusive) in the range: the same keyset walk of the settled index as the roots, joined to
    the child's primary key (namespace_id, parent, ...). A handful of parameters instead of an
    ``IN`` list of a thousand ids; rows come in no promised order (the caller sorts each root's
    children by primary key)."""
    hk = history_kind(kind)
    root, table = hk.root, child.table
    t, i = through
    cond = _range_cond(hk, ns_id, rng)
    if cursor is not None:
        cond.append(_after(hk, cursor))
    cond.append(or_(hk.settled < t, and_(hk.settled == t, root.c.id <= i)))
    parent = table.c[child.parent_column]
    on = and_(table.c.namespace_id == root.c.namespace_id, parent == root.c.id)
    q = select(*_columns(table, server_times)).select_from(root.join(table, on)).where(*cond)
    # Without ORDER BY/LIMIT the optimizer may prefer walking the whole namespace by PRIMARY
    # when a chunk is a large share of a small table; a chunk must cost its own rows only.
    return q.with_hint(root, f"FORCE INDEX ({settled_index(hk)})", "mysql")


def settled_index(hk: HistoryKind) -> str:
    """The name of the root table's (namespace_id, settled, id) index."""
    want = ["namespace_id", hk.settled_column, "id"]
    return next(str(ix.name) for ix in hk.root.indexes if [c.name for c in ix.columns] == want)


@dataclass(frozen=True)
class RootChunk:
    """Up to ``limit`` roots after a cursor with all their children."""

    roots: list[Any]  # row tuples in the root table's column order, (settled, id) order
    children: dict[str, dict[Any, list[Any]]] = field(default_factory=dict)  # table -> id
    has_more: bool = False  # a root follows the last one (the peeked extra row)
    cursor: Cursor | None = None  # key of the last root; None when there is none


def read_chunk(
    conn: Connection,
    kind: str,
    ns_id: bytes,
    rng: ArchiveRange,
    cursor: Cursor | None,
    limit: int,
) -> RootChunk:
    """Two statements: up to ``limit`` roots after ``cursor`` (plus one peeked to tell whether
    more follow), then the children of those roots. Never modifies a source row."""
    if rng.empty:
        return RootChunk([])
    hk = history_kind(kind)
    server_times = is_mysql(conn)
    q = roots_query(kind, ns_id, rng, cursor, limit + 1, server_times=server_times)
    rows = list(conn.execute(q).all())
    has_more = len(rows) > limit
    del rows[limit:]
    if not rows:
        return RootChunk([])
    names = list(hk.root.columns.keys())
    last = rows[-1]
    settled = last[names.index(hk.settled_column)]
    last_id = _id_bytes(last[names.index("id")])
    through = (parse_ts(settled) if isinstance(settled, str) else settled, last_id)
    children: dict[str, dict[Any, list[Any]]] = {}
    for child in hk.children:
        columns = list(child.table.columns.keys())
        parent_at = columns.index(child.parent_column)
        by_key = itemgetter(*(columns.index(c.name) for c in child.table.primary_key.columns))
        grouped: dict[Any, list[Any]] = defaultdict(list)
        cq = children_query(kind, child, ns_id, rng, cursor, through, server_times=server_times)
        for crow in conn.execute(cq).all():
            grouped[crow[parent_at]].append(crow)  # keyed like the root's id value
        for kids in grouped.values():
            if len(kids) > 1:
                kids.sort(key=by_key)  # primary-key order
        children[child.table.name] = grouped
    return RootChunk(rows, children, has_more, through)


def _id_bytes(value: Any) -> bytes:
    return bytes.fromhex(value) if isinstance(value, str) else bytes(value)


def line_encoder(kind: str) -> LineEncoder:
    """The line encoder for the row tuples :func:`read_chunk` returns for ``kind``."""
    hk = history_kind(kind)
    return LineEncoder(
        list(hk.root.columns.keys()),
        hk.settled_column,
        [(c.table.name, list(c.table.columns.keys())) for c in hk.children],
    )


def root_keys_in_range(conn: Connection, kind: str, ns_id: bytes, rng: ArchiveRange) -> list[bytes]:
    """Ids of every root in the range in (settled, id) order (tests and export comparisons)."""
    if rng.empty:
        return []
    hk = history_kind(kind)
    q = select(hk.root.c.id).where(*_range_cond(hk, ns_id, rng)).order_by(hk.settled, hk.root.c.id)
    return [bytes(r[0]) for r in conn.execute(q)]


def count_children(conn: Connection, kind: str, ns_id: bytes, rng: ArchiveRange) -> dict[str, int]:
    """Rows of each child table whose root lies in the range (``orbit plan preview``)."""
    hk = history_kind(kind)
    out: dict[str, int] = {}
    for child in hk.children:
        if rng.empty:
            out[child.table.name] = 0
            continue
        table = child.table
        on = and_(
            table.c.namespace_id == hk.root.c.namespace_id,
            table.c[child.parent_column] == hk.root.c.id,
        )
        q = (
            select(func.count())
            .select_from(hk.root.join(table, on))
            .where(*_range_cond(hk, ns_id, rng))
        )
        out[table.name] = int(conn.execute(q).scalar_one())
    return out


def settled_span(
    conn: Connection, kind: str, ns_id: bytes, rng: ArchiveRange
) -> tuple[datetime, datetime] | None:
    """The earliest and the latest settled time of the range's roots; None without roots."""
    if rng.empty:
        return None
    hk = history_kind(kind)
    q = select(func.min(hk.settled), func.max(hk.settled)).where(*_range_cond(hk, ns_id, rng))
    first, last = conn.execute(q).one()
    if first is None:
        return None
    return first, last  # typed by the column (SQLAlchemy's min/max keep the argument's type)


def replica_beat(conn: Connection) -> datetime | None:
    """The last tick's heartbeat as the source has applied it (None: not yet replicated)."""
    return conn.execute(select(func.max(heartbeat.c.beat_at))).scalar()
