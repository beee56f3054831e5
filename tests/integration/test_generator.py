"""The history generator (``orbit dev seed-history``): every kind into the real MariaDB, read
back byte-exact (exact decimals, 4-byte UTF-8, microseconds), with the settled/unsettled mix,
linked children and UUIDv7 ids; the CLI's options and its one-transaction behaviour."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.dev import generator
from orbit_tasks.errors import InvalidInput
from orbit_tasks.platform import store
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.cli import invoke_json, invoke_orbit, orbit_env

ROOTS = 200
CHILDREN = 3
CREATED_COLUMN = {
    "tasks": "created_at",
    "workflows": "created_at",
    "events": "created_at",
    "audit": "created_at",
    "deliveries": "created_at",
    "inbox": "received_at",
    "idempotency": "created_at",
}
JSON_COLUMNS = {
    "tasks": "request_json",
    "workflows": "input_json",
    "events": "payload_json",
    "audit": "detail_json",
    "deliveries": "payload_json",
    "inbox": "payload_json",
    "idempotency": "receipt_json",
}
HOUR = timedelta(hours=1)


def _key(row: dict[str, Any], parent: str | None = None) -> tuple[Any, ...]:
    if parent is None:
        return (row["id"],)
    no = row.get("attempt_no", row.get("step_no"))
    return (row[parent], no)


def _rows(conn: Any, table: Any, ns_id: bytes) -> list[dict[str, Any]]:
    return [
        dict(r._mapping) for r in conn.execute(select(table).where(table.c.namespace_id == ns_id))
    ]


@pytest.mark.mariadb
@pytest.mark.parametrize("kind", list(HISTORY_KINDS))
def test_seed_every_kind_round_trips_on_mariadb(kind: str, platform_engine: Engine) -> None:
    hk = HISTORY_KINDS[kind]
    children = CHILDREN if hk.children else 0
    spec = generator.make_spec(kind, ROOTS, children, days=10, settled_fraction=0.75)
    with platform_engine.begin() as conn:
        ns_id = store.create_namespace(conn, f"ns-{kind}")
        queue_ids = [store.create_queue(conn, ns_id, f"q{i}") for i in range(3)]
        now = db_now(conn)
        result = generator.seed_history(conn, spec, ns_id, queue_ids, random.Random(7), now)
    # the same seed and clock give the same rows: that is what the database must hold, exactly
    expected = list(generator.generate(spec, ns_id, queue_ids, random.Random(7), now))
    exp_roots = [r for c in expected for r in c.roots]
    exp_children = [r for c in expected for r in c.children]

    with platform_engine.connect() as conn:
        roots = _rows(conn, hk.root, ns_id)
        kids = _rows(conn, hk.children[0].table, ns_id) if hk.children else []
        json_col = JSON_COLUMNS[kind]
        stored_hex = dict(
            conn.execute(
                select(hk.root.c.id, func.hex(hk.root.c[json_col])).where(
                    hk.root.c.namespace_id == ns_id
                )
            ).all()
        )

    # counts
    assert result.roots == len(roots) == ROOTS
    assert result.settled + result.unsettled == ROOTS
    assert 0 < result.unsettled < result.settled
    assert sum(result.children.values()) == len(kids) == len(exp_children)

    # byte-exact round trip, microseconds included
    assert sorted(roots, key=_key) == sorted(exp_roots, key=_key)
    if hk.children:
        parent = hk.children[0].parent_column
        assert sorted(kids, key=lambda r: _key(r, parent)) == sorted(
            exp_children, key=lambda r: _key(r, parent)
        )
    for row in roots:  # the stored bytes are the UTF-8 of the generated text (4-byte chars too)
        assert stored_hex[row["id"]] == row[json_col].encode("utf-8").hex().upper()
    assert any(ord(ch) > 0xFFFF for r in roots for ch in r[json_col])
    assert any(r[hk.settled_column] and r[hk.settled_column].microsecond for r in roots)

    # exact decimals: 29 significant digits survive as text and parse exactly with Decimal
    for row in roots:
        doc = json.loads(row[json_col], parse_float=Decimal)
        amounts = [v for v in doc.values() if isinstance(v, Decimal)]
        assert amounts and all(len(v.as_tuple().digits) >= 20 for v in amounts if v > 1)
        literal = str(max(amounts))
        assert literal in row[json_col] and float(literal) != max(amounts)

    # settled / unsettled semantics per kind
    settled_col, created_col = hk.settled_column, CREATED_COLUMN[kind]
    nullable = hk.root.c[settled_col].nullable
    n_settled = 0
    for row in roots:
        value = row[settled_col]
        if nullable:
            is_settled = value is not None
        elif kind == "idempotency":
            is_settled = value <= now
            assert value - row["created_at"] == timedelta(hours=72)
        else:
            is_settled = value <= now - HOUR
            assert value <= now
        n_settled += is_settled
        if is_settled:
            assert now - timedelta(days=10) <= value <= now - HOUR
        # ids: 16 bytes, UUIDv7 whose time is the settled (else created) time
        rid = row["id"]
        assert isinstance(rid, bytes) and len(rid) == 16
        assert rid[6] >> 4 == 7 and rid[8] >> 6 == 0b10
        stamp = value if is_settled else row[created_col]
        assert int.from_bytes(rid[:6], "big") == generator.unix_ms(stamp)
    assert n_settled == result.settled

    # children are linked to existing roots; settled roots have exactly CHILDREN, all finished
    if hk.children:
        parent = hk.children[0].parent_column
        by_root: dict[bytes, list[dict[str, Any]]] = {}
        for child in kids:
            by_root.setdefault(child[parent], []).append(child)
        root_ids = {r["id"] for r in roots}
        assert set(by_root) <= root_ids
        for row in roots:
            mine = sorted(by_root.get(row["id"], []), key=lambda c: _key(c, parent))
            numbers = [c.get("attempt_no", c.get("step_no")) for c in mine]
            assert numbers == list(range(1, len(mine) + 1))
            if row[settled_col] is not None:
                assert len(mine) == CHILDREN
                assert all(c["finished_at"] is not None for c in mine)
                assert all(c["finished_at"] <= row[settled_col] for c in mine)
            else:
                assert len(mine) <= CHILDREN
    if kind == "tasks":
        assert {r["queue_id"] for r in roots} <= set(queue_ids)
        assert all(
            r["attempts"] == len([c for c in kids if c["task_id"] == r["id"]]) for r in roots
        )


def test_make_spec_validates_every_option() -> None:
    assert generator.make_spec("tasks", 1).children == generator.DEFAULT_CHILDREN
    assert generator.make_spec("events", 1).children == 0
    cases = [
        (dict(kind="nope", roots=1), "'nope'"),
        (dict(kind="tasks", roots=0), "1..10000000"),
        (dict(kind="tasks", roots=10_000_001), "1..10000000"),
        (dict(kind="tasks", roots=1, children=101), "0..100"),
        (dict(kind="tasks", roots=1, children=-1), "0..100"),
        (dict(kind="events", roots=1, children=1), "--children 0"),
        (dict(kind="tasks", roots=1, days=0), "1..3650"),
        (dict(kind="tasks", roots=1, settled_fraction=1.01), "0.0..1.0"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(InvalidInput, match=needle.replace(".", r"\.")):
            generator.make_spec(**kwargs)  # type: ignore[arg-type]


def test_generator_is_pure_and_chunked() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, 678901)
    spec = generator.make_spec("deliveries", 45, 2, days=2, random_ids=True)
    first = list(generator.generate(spec, b"n" * 16, [], random.Random(3), now, chunk_roots=20))
    again = list(generator.generate(spec, b"n" * 16, [], random.Random(3), now, chunk_roots=20))
    assert [len(c.roots) for c in first] == [20, 20, 5]
    assert first == again
    other = list(generator.generate(spec, b"n" * 16, [], random.Random(4), now, chunk_roots=20))
    assert other != first
    ids = [r["id"] for c in first for r in c.roots]
    assert len(set(ids)) == 45
    # random ids: not UUIDv7 stamps of the generated times
    stamps = {generator.unix_ms(r["created_at"]) for c in first for r in c.roots}
    assert not any(int.from_bytes(i[:6], "big") in stamps for i in ids)
    with pytest.raises(InvalidInput, match="queue"):
        list(
            generator.generate(generator.make_spec("tasks", 1), b"n" * 16, [], random.Random(), now)
        )
    assert generator.json_text({"a": "𝄞"}, {"x": "1.10"}) == '{"a":"𝄞","x":1.10}'
    assert generator.json_text({}, {"x": "0.10"}) == '{"x":0.10}'


@pytest.fixture
def seeded_env(any_platform_url: str) -> Iterator[tuple[dict[str, str], Engine]]:
    env = orbit_env(any_platform_url)
    engine = make_engine(any_platform_url)
    invoke_json(["namespace", "create", "acme"], env)
    yield env, engine
    engine.dispose()


def test_cli_seed_history_options(seeded_env: tuple[dict[str, str], Engine]) -> None:
    env, engine = seeded_env
    args = ["dev", "seed-history", "acme", "--kind", "workflows", "--roots", "30"]
    out = invoke_json([*args, "--children", "4", "--random-ids", "--seed", "5"], env)
    steps = out["children"]["orbit_workflow_steps"]
    assert out["roots"] == 30 and out["table"] == "orbit_workflows"
    assert out["settled"] + out["unsettled"] == 30 and out["settled"] * 4 <= steps
    wf = HISTORY_KINDS["workflows"]

    def counts() -> tuple[int, int, int]:
        with engine.connect() as conn:
            roots = conn.execute(select(func.count()).select_from(wf.root)).scalar()
            kids = conn.execute(select(func.count()).select_from(wf.children[0].table)).scalar()
            open_roots = conn.execute(
                select(func.count()).select_from(wf.root).where(wf.root.c.closed_at.is_(None))
            ).scalar()
        return int(roots or 0), int(kids or 0), int(open_roots or 0)

    assert counts() == (30, steps, out["unsettled"])
    # bad options: exit 2, nothing written
    for bad, needle in (
        (["--roots", "0"], "--roots 0"),
        (["--settled-fraction", "1.5"], "1.5"),
        (["--days", "0"], "--days 0"),
        (["--children", "101"], "--children 101"),
        (["--roots", "many"], "many"),
    ):
        result = invoke_orbit([*args, *bad], env)
        assert result.exit_code == 2 and needle in result.stderr, (bad, result.stderr)
    assert counts() == (30, steps, out["unsettled"])
    # all settled / none settled
    every = invoke_json([*args, "--settled-fraction", "1"], env)
    none = invoke_json([*args, "--settled-fraction", "0", "--children", "0"], env)
    assert (every["settled"], none["settled"], none["children"]) == (
        30,
        0,
        {"orbit_workflow_steps": 0},
    )
    assert counts()[2] == out["unsettled"] + 30


def test_cli_seed_history_is_one_transaction(
    seeded_env: tuple[dict[str, str], Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collision in the third chunk rolls back the two chunks already inserted."""
    env, engine = seeded_env
    monkeypatch.setattr(generator, "CHUNK_ROOTS", 10)
    spec = generator.make_spec("events", 30, random_ids=True)
    # with --random-ids the ids depend on the seed only, not on the clock
    a = list(generator.generate(spec, b"n" * 16, [], random.Random(9), datetime(2026, 1, 1)))
    b = list(generator.generate(spec, b"n" * 16, [], random.Random(9), datetime(2027, 5, 5)))
    ids = [r["id"] for c in a for r in c.roots]
    assert ids == [r["id"] for c in b for r in c.roots]
    with engine.begin() as conn:
        ns = store.resolve_namespace(conn, "acme")
        planted = dict(a[0].roots[25], namespace_id=ns.id)
        conn.execute(HISTORY_KINDS["events"].root.insert().values(**planted))

    args = ["dev", "seed-history", "acme", "--kind", "events", "--roots", "30"]
    result = invoke_orbit([*args, "--random-ids", "--seed", "9"], env)
    assert result.exit_code == 3 and "collide" in result.stderr, result.stderr
    with engine.connect() as conn:
        rows = conn.execute(select(HISTORY_KINDS["events"].root.c.id)).scalars().all()
    assert rows == [ids[25]]
    # another seed goes through, in chunks of 10
    out = invoke_json([*args, "--random-ids", "--seed", "10"], env)
    assert out["roots"] == 30
