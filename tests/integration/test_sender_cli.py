"""``orbit sender list/show/requeue`` against a real business database (MariaDB)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.db.engine import db_now
from tests.cli_support import invoke_json, invoke_orbit, orbit_env, run_orbit
from tests.dbutil import mariadb_database, migrated_engine
from tests.sender_support import enqueue_many, rows

pytestmark = pytest.mark.mariadb

NS = "a1" * 16
Q = "b2" * 16


@pytest.fixture
def biz() -> Iterator[tuple[str, Engine]]:
    with mariadb_database("orbit_sc") as url, migrated_engine(url, "business") as engine:
        yield url, engine


def _review(engine: Engine, op: str, **values: object) -> None:
    sets = ", ".join(f"{k}=:{k}" for k in values)
    extra = f", {sets}" if sets else ""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sender_outbox SET state='REVIEW', wake_at=NULL, "
                f"last_code='UNAVAILABLE'{extra} WHERE operation_id=:op"
            ),
            {"op": op, **values},
        )


def test_list_show_requeue(biz: tuple[str, Engine]) -> None:
    url, engine = biz
    env = orbit_env("sqlite:///unused.sqlite3", url)
    ops = sorted(enqueue_many(engine, NS, [Q], 3))
    _review(engine, ops[0])
    listed = invoke_json(["sender", "list"], env)
    assert [r["operation_id"] for r in listed] == ops
    assert {r["state"] for r in listed} == {"PENDING", "REVIEW"}
    review = invoke_json(["sender", "list", "--state", "REVIEW"], env)
    assert [r["operation_id"] for r in review] == [ops[0]]
    page = invoke_json(["sender", "list", "--limit", "1", "--after", f"{NS}:{ops[0]}"], env)
    assert [r["operation_id"] for r in page] == [ops[1]]
    human = invoke_orbit(["sender", "list", "--state", "REVIEW"], env)
    assert human.exit_code == 0 and ops[0] in human.stdout and "UNAVAILABLE" in human.stdout

    shown = invoke_json(["sender", "show", NS, ops[0]], env)
    assert shown["state"] == "REVIEW" and shown["idempotency_key"] == "op-" + ops[0]
    assert shown["digest_ok"] is True and "request_json" not in shown
    assert shown["source_ref"].startswith("orders/") and shown["request_bytes"] > 0

    before = rows(engine)[ops[0]][0]
    done = invoke_json(["sender", "requeue", NS, ops[0]], env)
    assert done == {"namespace_id": NS, "operation_id": ops[0], "state": "PENDING"}
    after = rows(engine)[ops[0]][0]
    assert after.state == "PENDING" and after.wake_at is not None
    assert (after.idempotency_key, after.request_json, after.request_digest) == (
        before.idempotency_key,
        before.request_json,
        before.request_digest,
    )
    assert (after.send_count, after.lease_epoch) == (before.send_count, before.lease_epoch)
    again = invoke_orbit(["sender", "requeue", NS, ops[0]], env)
    assert again.exit_code == 3 and "only REVIEW rows" in again.stderr


def test_requeue_refusals_and_errors(biz: tuple[str, Engine]) -> None:
    url, engine = biz
    env = orbit_env("sqlite:///unused.sqlite3", url)
    late, spent = enqueue_many(engine, NS, [Q], 2)
    with engine.connect() as conn:
        now = db_now(conn)
    deadline = now - dt.timedelta(seconds=1)
    _review(engine, late, created_at=deadline - dt.timedelta(hours=24), send_deadline_at=deadline)
    _review(engine, spent, send_count=100, lease_epoch=100)
    res = invoke_orbit(["sender", "requeue", NS, late], env)
    assert res.exit_code == 3 and "deadline" in res.stderr
    res = invoke_orbit(["sender", "requeue", NS, spent], env)
    assert res.exit_code == 3 and "100" in res.stderr
    assert {r.state for r, _ in rows(engine).values()} == {"REVIEW"}
    missing = "c3" * 16
    assert invoke_orbit(["sender", "show", NS, missing], env).exit_code == 4
    assert invoke_orbit(["sender", "requeue", NS, missing], env).exit_code == 4
    bad = invoke_orbit(["sender", "show", NS, "XYZ"], env)
    assert bad.exit_code == 2 and "'XYZ'" in bad.stderr and "32 lowercase" in bad.stderr
    assert invoke_orbit(["sender", "list", "--state", "LOST"], env).exit_code == 2
    assert invoke_orbit(["sender", "list", "--after", "nope"], env).exit_code == 2


def test_real_console_script(biz: tuple[str, Engine]) -> None:
    url, engine = biz
    (op,) = enqueue_many(engine, NS, [Q], 1)
    env = orbit_env("sqlite:///unused.sqlite3", url)
    res = run_orbit(["sender", "show", NS, op, "--json"], env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["state"] == "PENDING"
    for cmd in (["sender", "list"], ["sender", "show"], ["sender", "requeue"]):
        assert run_orbit([*cmd, "--help"], env).returncode == 0
