"""Helpers of the restore tests: the format-1 fixture, target rows read back through
reflection (so that nothing of the restore code reads them), and exact comparisons."""

from __future__ import annotations

import json
import shutil
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, Table, insert, select, text

from orbit_tasks.archive.jobs import Job
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import source
from orbit_tasks.db import platform_tables as pt
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.history_tables import tasks
from orbit_tasks.ids import new_id
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.cli import run_orbit
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


# --- the round trip (shared by the folder and the S3 tests) ----------------------------------

ODD_JSON = '{"amount":1.10,"big":12345678901234567890.000,"huge":1E+400,"s":"😀 \\u00e9 𝄞"}'


def odd_task(engine: Engine, ns: bytes, queue: bytes) -> bytes:
    """A root with the edge cases: NULLs everywhere they are allowed, exact decimals that no
    float holds, 4-byte UTF-8 in VARCHAR and JSON text, a trailing space, microsecond 1, no
    children (an empty child list)."""
    rid = new_id()
    with engine.begin() as conn:
        now = db_now(conn)
        conn.execute(
            insert(tasks).values(
                namespace_id=ns, id=rid, queue_id=queue, state="DONE😀", idempotency_key=None,
                request_json=ODD_JSON, result_json=None, error_code="E ", attempts=0,
                created_at=now - timedelta(hours=3), started_at=None,
                finished_at=(now - timedelta(hours=2)).replace(microsecond=1),
            )
        )  # fmt: skip
    return rid


def job_rows(engine: Engine, job: Job) -> dict[str, list[dict[str, Any]]]:
    hk = HISTORY_KINDS[job.kind]
    with engine.connect() as conn:
        rng = job_store.job_range(conn, job)
        ids = source.root_keys_in_range(conn, job.kind, job.namespace_id, rng)
    out = {hk.root.name: source_rows(engine, hk.root, job.namespace_id, ids)}
    for c in hk.children:
        out[c.table.name] = source_rows(engine, c.table, job.namespace_id, ids, c.parent_column)
    return out


def assert_target_holds(target_url: str, expected: dict[str, list[dict[str, Any]]]) -> None:
    target = make_engine(target_url)
    try:
        for table, rows in expected.items():
            assert_rows_identical(rows, reflected_rows(target, table), table)
    finally:
        target.dispose()


def restore_job(env: dict[str, str], job: Job, volume: Path | str, into: str) -> dict[str, Any]:
    """``orbit job restore`` through the real script; its JSON lines checked, the summary."""
    args = ["job", "restore", job.namespace_id.hex(), job.id.hex(), "--volume", str(volume)]
    proc = run_orbit([*args, "--into", into, "--json"], env)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [ln["event"] for ln in lines] == ["batch"] * job.batches + ["summary"]
    assert [ln["seq"] for ln in lines[:-1]] == list(range(1, job.batches + 1))
    return lines[-1]
