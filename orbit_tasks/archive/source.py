"""The archiver's read-only source queries (SPEC §5 step 3): ``roots_total`` of a fixed range and
the hot batch query — a keyset on (settled, id) over the kind's settled index
(``ix_<kind>_settled``), written in the expanded form ``settled > :t OR (settled = :t AND id > :i)``
— with every child row of the fetched roots. Nothing here ever modifies a source row.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, func, or_, select

from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.platform.history import HistoryKind, history_kind


def _range_cond(hk: HistoryKind, ns_id: bytes, rng: ArchiveRange) -> list[Any]:
    cond = [hk.root.c.namespace_id == ns_id, hk.settled < rng.until]
    if rng.from_ is not None:
        cond.append(hk.settled >= rng.from_)
    return cond


def count_roots(conn: Connection, kind: str, ns_id: bytes, rng: ArchiveRange) -> int:
    """``roots_total`` of the manifest: roots with ``from <= settled < until``."""
    if rng.empty:
        return 0
    hk = history_kind(kind)
    q = select(func.count()).select_from(hk.root).where(*_range_cond(hk, ns_id, rng))
    return int(conn.execute(q).scalar_one())


@dataclass(frozen=True)
class SourcePage:
    records: list[Any]  # fileformat.RootRecord
    has_more: bool


def roots_query(
    kind: str,
    ns_id: bytes,
    rng: ArchiveRange,
    cursor: tuple[datetime, bytes] | None,
    limit: int,
) -> Any:
    """The hot batch query: keyset on (settled, id) in the range, on the kind's settled index."""
    hk = history_kind(kind)
    cond = _range_cond(hk, ns_id, rng)
    if cursor is not None:
        t, i = cursor
        cond.append(or_(hk.settled > t, and_(hk.settled == t, hk.root.c.id > i)))
    return select(hk.root).where(*cond).order_by(hk.settled, hk.root.c.id).limit(limit)


def read_roots_after(
    conn: Connection,
    kind: str,
    ns_id: bytes,
    rng: ArchiveRange,
    cursor: tuple[datetime, bytes] | None,
    limit: int,
) -> SourcePage:
    """Up to ``limit`` roots after ``cursor`` with all their children; peeks one more root to tell
    whether this page is the last one. Never modifies a source row."""
    from orbit_tasks.archive.fileformat import RootRecord

    if rng.empty:
        return SourcePage([], False)
    hk = history_kind(kind)
    rows = conn.execute(roots_query(kind, ns_id, rng, cursor, limit + 1)).all()
    has_more = len(rows) > limit
    rows = rows[:limit]
    ids = [r.id for r in rows]
    children: dict[str, dict[bytes, list[dict[str, Any]]]] = {}
    for child in hk.children:
        grouped: dict[bytes, list[dict[str, Any]]] = defaultdict(list)
        if ids:
            t = child.table
            parent = t.c[child.parent_column]
            pk = list(t.primary_key.columns)
            for crow in conn.execute(
                select(t).where(t.c.namespace_id == ns_id, parent.in_(ids)).order_by(*pk)
            ):
                grouped[bytes(crow._mapping[child.parent_column])].append(dict(crow._mapping))
        children[child.table.name] = grouped
    records = [
        RootRecord(
            root=dict(r._mapping),
            children={name: list(g.get(bytes(r.id), [])) for name, g in children.items()},
        )
        for r in rows
    ]
    return SourcePage(records, has_more)


def root_keys_in_range(conn: Connection, kind: str, ns_id: bytes, rng: ArchiveRange) -> list[bytes]:
    """Ids of every root in the range in (settled, id) order (tests and export comparisons)."""
    if rng.empty:
        return []
    hk = history_kind(kind)
    q = select(hk.root.c.id).where(*_range_cond(hk, ns_id, rng)).order_by(hk.settled, hk.root.c.id)
    return [bytes(r[0]) for r in conn.execute(q)]
