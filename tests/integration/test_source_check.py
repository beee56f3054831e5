"""The batch check of a replica read (issue 24 item 1, archive/store/source_check.py) on a real
MariaDB: the digests the server computes over a key range equal the digests Python computes over
the rows the hot read returned, for every history kind and every chunk of a job's range; one
changed value, a deleted or an added row in the range is a difference that names its table.

One database plays both sides here (the check compares a chunk, however it was read, with the
server's key range); the replica tests (test_archive_replica.py) run it between two servers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import source, source_check
from orbit_tasks.errors import ReplicaDiverged
from orbit_tasks.platform.history import HISTORY_KINDS, history_kind
from tests.support.archive_jobs import make_namespace, seed

pytestmark = pytest.mark.mariadb

FAR = ArchiveRange(None, datetime(2100, 1, 1, tzinfo=UTC).replace(tzinfo=None))


def _chunks(engine: Engine, kind: str, ns: bytes, limit: int) -> list[tuple[object, object]]:
    out = []
    cursor = None
    with engine.connect() as conn:
        while True:
            with conn.begin():
                chunk = source.read_chunk(conn, kind, ns, FAR, cursor, limit)
            out.append((cursor, chunk))
            if not chunk.has_more:
                return out
            cursor = chunk.cursor


@pytest.mark.parametrize("kind", list(HISTORY_KINDS))
def test_the_servers_digest_equals_the_digest_of_the_rows_read(
    platform_engine: Engine, kind: str
) -> None:
    ns, q = make_namespace(platform_engine, "parity")
    seed(platform_engine, ns, q, kind, 45)
    other, q2 = make_namespace(platform_engine, "other")
    seed(platform_engine, other, q2, kind, 10, seed=2)  # another namespace: never counted
    with platform_engine.connect() as conn:
        chunks = _chunks(platform_engine, kind, ns, 8)
        assert len(chunks) >= 4
        for after, chunk in chunks:
            source_check.check_chunk(conn, kind, ns, FAR, after, chunk)  # type: ignore[arg-type]
        hk = history_kind(kind)
        total = source_check.primary_digests(conn, kind, ns, FAR, None, None)
        assert total[hk.root.name].rows == sum(len(c.roots) for _, c in chunks) > 30  # type: ignore[attr-defined]
        children = sum(d.rows for t, d in total.items() if t != hk.root.name)
        assert (children > 0) == bool(hk.children)


def _one(engine: Engine, sql: str, **params: object) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), params)


@pytest.mark.parametrize(
    ("change", "table", "needle"),
    [
        ("UPDATE orbit_task_attempts SET worker = CONCAT(worker, 'x') "
         "WHERE task_id = :id AND attempt_no = 1", "orbit_task_attempts", "checksum"),
        ("UPDATE orbit_tasks SET attempts = attempts + 1 WHERE id = :id", "orbit_tasks",
         "checksum"),
        ("UPDATE orbit_tasks SET result_json = NULL WHERE id = :id", "orbit_tasks", "checksum"),
        ("DELETE FROM orbit_task_attempts WHERE task_id = :id", "orbit_task_attempts", "rows"),
        ("DELETE FROM orbit_tasks WHERE id = :id", "orbit_tasks", "rows"),
    ],
)  # fmt: skip
def test_one_changed_row_is_a_difference_naming_its_table(
    platform_engine: Engine, change: str, table: str, needle: str
) -> None:
    ns, q = make_namespace(platform_engine, "changed")
    seed(platform_engine, ns, q, "tasks", 30)
    chunks = _chunks(platform_engine, "tasks", ns, 10)
    after, chunk = chunks[1]
    rid = chunk.roots[3][1]  # type: ignore[attr-defined]
    _one(platform_engine, change, id=bytes.fromhex(rid))
    with platform_engine.connect() as conn:
        with pytest.raises(ReplicaDiverged, match=rf"^{table}: {needle} differ"):
            source_check.check_chunk(conn, "tasks", ns, FAR, after, chunk)  # type: ignore[arg-type]
        source_check.check_chunk(conn, "tasks", ns, FAR, *chunks[0])  # type: ignore[arg-type]


def test_a_root_added_after_the_last_chunk_is_counted(platform_engine: Engine) -> None:
    """The last chunk covers the range up to its end: a root the read did not see after its last
    root is a difference (a replica that lost the range's last root)."""
    ns, q = make_namespace(platform_engine, "tail")
    seed(platform_engine, ns, q, "events", 12)
    chunks = _chunks(platform_engine, "events", ns, 5)
    after, last = chunks[-1]
    late = datetime.now(UTC).replace(tzinfo=None) + timedelta(days=3)
    _one(
        platform_engine,
        "INSERT INTO orbit_events (namespace_id, id, type, payload_json, created_at) "
        "VALUES (:ns, :id, 't', '{}', :at)",
        ns=ns, id=b"\xff" * 16, at=late,
    )  # fmt: skip
    with (
        platform_engine.connect() as conn,
        pytest.raises(ReplicaDiverged, match="orbit_events: rows differ .* the range's end"),
    ):
        source_check.check_chunk(conn, "events", ns, FAR, after, last)  # type: ignore[arg-type]


@pytest.mark.parametrize("level", ["REPEATABLE READ", "READ COMMITTED", "SERIALIZABLE"])
def test_the_check_reads_committed_rows_at_every_isolation_level(
    platform_engine: Engine, level: str
) -> None:
    """The primary's side of the check is one statement in a transaction of its own: a row
    changed and committed after the chunk was read is a difference at every isolation level of
    the check's connection, also one that already ran a check (no snapshot kept across
    chunks)."""
    ns, q = make_namespace(platform_engine, "levels")
    seed(platform_engine, ns, q, "events", 20)
    chunks = _chunks(platform_engine, "events", ns, 50)
    ((after, chunk),) = chunks
    with platform_engine.connect().execution_options(isolation_level=level) as conn:
        with conn.begin():
            source_check.check_chunk(conn, "events", ns, FAR, after, chunk)  # type: ignore[arg-type]
        rid = chunk.roots[5][1]  # type: ignore[attr-defined]
        _one(
            platform_engine,
            "UPDATE orbit_events SET type = 'x' WHERE id = :id",
            id=bytes.fromhex(rid),
        )
        with conn.begin(), pytest.raises(ReplicaDiverged, match="orbit_events: checksum differ"):
            source_check.check_chunk(conn, "events", ns, FAR, after, chunk)  # type: ignore[arg-type]


def test_the_digests_agree_on_nulls_four_byte_text_separators_and_trailing_spaces(
    platform_engine: Engine,
) -> None:
    """Values the two spellings could disagree on: NULLs, 4-byte characters, the separator
    itself, trailing spaces, zero microseconds. Then a ``#`` moved from one text column to the
    next (``state`` 'x#y', ``idempotency_key`` 'k' -> 'x', 'y#k': the same ``#``-joined text) is
    a difference: the lengths."""
    ns, q = make_namespace(platform_engine, "odd")
    seed(platform_engine, ns, q, "tasks", 12)
    ((after, first),) = _chunks(platform_engine, "tasks", ns, 50)
    ids = [bytes.fromhex(r[1]) for r in first.roots]  # type: ignore[attr-defined]
    odd = (
        "UPDATE orbit_tasks SET result_json = NULL, error_code = 'a#b  ', state = 'x#y', "
        "idempotency_key = 'k', request_json = '{\"n\": \"😀 #\"}' WHERE id = :id"
    )
    _one(platform_engine, odd, id=ids[0])
    _one(
        platform_engine,
        "UPDATE orbit_tasks SET started_at = '2026-01-02 03:04:05.000000' WHERE id = :id",
        id=ids[1],
    )
    ((after, chunk),) = _chunks(platform_engine, "tasks", ns, 50)
    with platform_engine.connect() as conn:
        source_check.check_chunk(conn, "tasks", ns, FAR, after, chunk)  # type: ignore[arg-type]
    moved = "UPDATE orbit_tasks SET state = 'x', idempotency_key = 'y#k' WHERE id = :id"
    _one(platform_engine, moved, id=ids[0])
    with (
        platform_engine.connect() as conn,
        pytest.raises(ReplicaDiverged, match="orbit_tasks: checksum differ"),
    ):
        source_check.check_chunk(conn, "tasks", ns, FAR, after, chunk)  # type: ignore[arg-type]
