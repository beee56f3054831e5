"""Helpers of the restore tests: the format-1 fixture, target rows read back through
reflection (so that nothing of the restore code reads them), and exact comparisons."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, Table, insert, select, text

from orbit_tasks.db import platform_tables as pt
from tests.support.typed_json import load_rows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "archive-format-1"
PLATFORM_TABLES = {
    t.name: t for t in (pt.namespaces, pt.archive_storages, pt.archive_policies, pt.archive_jobs)
}


def fixture_rows(name: str) -> dict[str, list[dict[str, Any]]]:
    return load_rows(json.loads((FIXTURE / name).read_text(encoding="utf-8")))


def install_format1_fixture(engine: Engine, tmp: Path) -> tuple[bytes, bytes, Path]:
    """The fixture's platform rows in ``engine`` and a copy of its volume under ``tmp``.
    Returns (namespace id, job id, volume path)."""
    rows = fixture_rows("platform-rows.json")
    with engine.begin() as conn:
        for name, table in PLATFORM_TABLES.items():
            conn.execute(insert(table), rows[name])
    volume = tmp / "format1-volume"
    shutil.copytree(FIXTURE / "volume", volume)
    job = rows["orbit_archive_jobs"][0]
    return job["namespace_id"], job["id"], volume


def reflected_rows(url_engine: Engine, table_name: str) -> list[dict[str, Any]]:
    """Every row of a target table, read through a reflected table, sorted by primary key."""
    table = Table(table_name, MetaData(), autoload_with=url_engine)
    pk = list(table.primary_key.columns)
    with url_engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(table).order_by(*pk))]


def source_rows(
    engine: Engine, table: Table, ns_id: bytes, ids: list[bytes], link: str = "id"
) -> list[dict[str, Any]]:
    """Rows of a source history table for the given roots (``link``: ``id`` for the root table,
    the parent column for a child table), sorted by primary key."""
    with engine.connect() as conn:
        q = select(table).where(table.c.namespace_id == ns_id, table.c[link].in_(ids))
        rows = [dict(r._mapping) for r in conn.execute(q)]
    pk = [c.name for c in table.primary_key.columns]
    return sorted(rows, key=lambda r: tuple(r[k] for k in pk))


def assert_rows_identical(expected: list[dict], got: list[dict], what: str) -> None:
    """Row by row, column by column, value and Python type."""
    assert len(got) == len(expected), (what, len(got), len(expected))
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert set(have) == set(want), (what, i, set(have) ^ set(want))
        for col, value in want.items():
            assert type(have[col]) is type(value), (what, i, col, type(have[col]), type(value))
            assert have[col] == value, (what, i, col)


def sqlite_raw(path: Path, sql: str) -> list[tuple]:
    """What an analyst sees with the sqlite3 module (no SQLAlchemy type processing)."""
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def column_shapes(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    """MySQL/MariaDB: each column's name, position, full type, nullability, charset, collation
    and primary-key position, from information_schema."""
    with engine.connect() as conn:
        cols = conn.execute(
            text(
                "SELECT c.ORDINAL_POSITION, c.COLUMN_NAME, c.COLUMN_TYPE, c.IS_NULLABLE, "
                "c.CHARACTER_SET_NAME, c.COLLATION_NAME, k.ORDINAL_POSITION AS pk "
                "FROM information_schema.COLUMNS c LEFT JOIN information_schema.KEY_COLUMN_USAGE k "
                "ON k.TABLE_SCHEMA = c.TABLE_SCHEMA AND k.TABLE_NAME = c.TABLE_NAME "
                "AND k.COLUMN_NAME = c.COLUMN_NAME AND k.CONSTRAINT_NAME = 'PRIMARY' "
                "WHERE c.TABLE_SCHEMA = DATABASE() AND c.TABLE_NAME = :t "
                "ORDER BY c.ORDINAL_POSITION"
            ),
            {"t": table},
        )
        return [tuple(r) for r in cols]
