"""A chunk read from the replica checked against the primary (issue 24, pt-table-checksum style):
per table, the key range's row count and a content digest computed **on the primary** (no row
crosses the network), compared with the same digest computed in Python over the rows the
replica returned -- the rows that go into the files, not a second read of the replica.

The key range of a chunk is the one the read walked: roots after the cursor up to the chunk's
last root (inclusive), or to the end of the job's range when no root follows (so a root missing
or added after the last one on the replica is counted too), and every child row of those roots
(joined exactly as :func:`source.children_query` joins them). Every root and every child row is
covered; nothing is sampled.

A row's digest is ``CRC32(CONCAT_WS('#', v1, .., vn, nulls, len1, .., lenk))``: the values
nearly as stored (a binary as ``HEX``, a datetime cast to text, integers in decimal, text as
stored -- the hot read's spelling functions doubled the statement's cost), the NULL flags of the
nullable columns (``CONCAT_WS`` skips NULLs), and the character length of every text column (a
``#`` moved from one text column to the next changes a length). The worker turns the hot read's
spelling into the server's (hex upper-cased, the archive's timestamp back to the server's). A
table's digest is ``COUNT(*)`` and ``BIT_XOR`` of the row digests (pt-table-checksum's): one
changed row changes the XOR unless its CRC32 collides (2^-32); a row missing or added changes
the count.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    DateTime,
    LargeBinary,
    String,
    Table,
    Text,
    and_,
    func,
    literal,
    or_,
    select,
    union_all,
)

from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store.source import (
    Cursor,
    RootChunk,
    _after,
    _range_cond,
    settled_index,
)
from orbit_tasks.errors import ReplicaDiverged
from orbit_tasks.platform.history import history_kind

SEPARATOR = "#"


@dataclass(frozen=True)
class Digest:
    """Rows of one table in a key range and the XOR of their CRC32s."""

    rows: int = 0
    xor: int = 0


def _text_columns(table: Table) -> list[str]:
    return [c.name for c in table.columns if isinstance(c.type, String | Text)]


def _row_crc_sql(table: Table) -> Any:
    """The server's row digest of ``table``: its columns nearly as stored (a binary as ``HEX``, a
    datetime cast to text ``YYYY-MM-DD HH:MM:SS.ffffff``: the hot read's ``DATE_FORMAT`` and
    ``LOWER`` per value doubled the statement's cost), the NULL flags of the nullable columns,
    the lengths of the text columns."""
    cols = list(table.columns)
    parts: list[Any] = [func.hex(c) if isinstance(c.type, LargeBinary) else c for c in cols]
    nullable = [c for c in cols if c.nullable]
    if nullable:
        parts.append(func.concat(*(func.isnull(c) for c in nullable)))
    parts += [func.char_length(table.c[name]) for name in _text_columns(table)]
    return func.crc32(func.concat_ws(literal(SEPARATOR), *parts))


@dataclass(frozen=True)
class _Shape:
    """What the Python twin needs of a table: the positions of its binary, datetime, nullable
    and text columns."""

    binary_at: tuple[int, ...]
    time_at: tuple[int, ...]
    nullable_at: tuple[int, ...]
    text_at: tuple[int, ...]


def _shape(table: Table) -> _Shape:
    cols = list(table.columns)
    names = [c.name for c in cols]
    return _Shape(
        tuple(i for i, c in enumerate(cols) if isinstance(c.type, LargeBinary)),
        tuple(i for i, c in enumerate(cols) if isinstance(c.type, DateTime)),
        tuple(i for i, c in enumerate(cols) if c.nullable),
        tuple(names.index(n) for n in _text_columns(table)),
    )


def row_crc(row: Sequence[Any], shape: _Shape) -> int:
    """The Python twin of :func:`_row_crc_sql` over a row the hot read returned (MySQL/MariaDB
    spelling: binaries as lowercase hex, datetimes as the archive's ``...T...Z`` timestamps)."""
    values = list(row)
    for i in shape.binary_at:
        if values[i] is not None:
            values[i] = values[i].upper()
    for i in shape.time_at:
        v = values[i]
        if v is not None:
            values[i] = f"{v[:10]} {v[11:26]}"
    parts = [v if v.__class__ is str else str(v) for v in values if v is not None]
    if shape.nullable_at:
        parts.append("".join("1" if row[i] is None else "0" for i in shape.nullable_at))
    parts += [str(len(row[i])) for i in shape.text_at if row[i] is not None]
    return zlib.crc32(SEPARATOR.join(parts).encode("utf-8"))


def _digest(rows: Iterable[Sequence[Any]], table: Table) -> Digest:
    shape = _shape(table)
    n = x = 0
    for row in rows:
        n += 1
        x ^= row_crc(row, shape)
    return Digest(n, x)


def chunk_digests(kind: str, chunk: RootChunk) -> dict[str, Digest]:
    """Per table, the digest of the rows a chunk read holds (roots, then each child table)."""
    hk = history_kind(kind)
    out = {hk.root.name: _digest(chunk.roots, hk.root)}
    for child in hk.children:
        rows = (row for kids in chunk.children.get(child.table.name, {}).values() for row in kids)
        out[child.table.name] = _digest(rows, child.table)
    return out


def primary_digests_query(
    kind: str, ns_id: bytes, rng: ArchiveRange, after: Cursor | None, through: Cursor | None
) -> Any:
    """One statement: per table, ``(table, COUNT(*), BIT_XOR)`` of the row digests of the
    roots after ``after`` up to ``through`` (inclusive; None: to the end of the range) and of
    their children, each read on the kind's settled index."""
    hk = history_kind(kind)
    root = hk.root
    cond = _range_cond(hk, ns_id, rng)
    if after is not None:
        cond.append(_after(hk, after))
    if through is not None:
        t, i = through
        cond.append(or_(hk.settled < t, and_(hk.settled == t, root.c.id <= i)))
    hint = f"FORCE INDEX ({settled_index(hk)})"

    def part(table: Table, source: Any) -> Any:
        crc = _row_crc_sql(table)
        q = select(
            literal(table.name).label("t"),
            func.count().label("n"),
            func.coalesce(func.bit_xor(crc), 0).label("x"),
        ).select_from(source)
        return q.where(*cond).with_hint(root, hint, "mysql")

    parts = [part(root, root)]
    for child in hk.children:
        table = child.table
        on = and_(
            table.c.namespace_id == root.c.namespace_id, table.c[child.parent_column] == root.c.id
        )
        parts.append(part(table, root.join(table, on)))
    return union_all(*parts) if len(parts) > 1 else parts[0]


def primary_digests(
    conn: Connection,
    kind: str,
    ns_id: bytes,
    rng: ArchiveRange,
    after: Cursor | None,
    through: Cursor | None,
) -> dict[str, Digest]:
    q = primary_digests_query(kind, ns_id, rng, after, through)
    return {str(t): Digest(int(n), int(x)) for t, n, x in conn.execute(q).all()}


def check_chunk(
    primary: Connection,
    kind: str,
    ns_id: bytes,
    rng: ArchiveRange,
    after: Cursor | None,
    chunk: RootChunk,
) -> None:
    """Raise :class:`ReplicaDiverged` (naming the table and the key range) unless the rows of
    ``chunk`` -- read from the replica after ``after`` -- equal the primary's in the same key
    range, table by table."""
    through = chunk.cursor if chunk.has_more else None
    want = primary_digests(primary, kind, ns_id, rng, after, through)
    got = chunk_digests(kind, chunk)
    for table, mine in got.items():
        theirs = want.get(table, Digest())
        if mine != theirs:
            what = "rows" if mine.rows != theirs.rows else "checksum"
            start = "the range's start" if after is None else _key_text(after)
            end = "the range's end" if through is None else _key_text(through)
            raise ReplicaDiverged(
                f"{table}: {what} differ from the primary's between {start} and {end} "
                f"(replica {mine.rows} rows, primary {theirs.rows})"
            )


def _key_text(key: Cursor) -> str:
    return f"({key[0].isoformat()}, {key[1].hex()})"
