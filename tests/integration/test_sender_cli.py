"""``orbit sender list/show/requeue`` against a real business database (MariaDB)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text

from orbit_tasks.db.engine import db_now
from orbit_tasks.db.platform_tables import namespaces
from tests.support import sender as sender_support
from tests.support.cli import invoke_json, invoke_orbit, orbit_env, run_orbit
from tests.support.db import mariadb_database, migrated_engine
from tests.support.sender import World, enqueue_many, rows

pytestmark = pytest.mark.mariadb

world = sender_support.world  # module fixture: platform database + API (credential identity)

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
    listed = invoke_json(["sender", "list"], env)["items"]
    assert [r["operation_id"] for r in listed] == ops
    assert {r["state"] for r in listed} == {"PENDING", "REVIEW"}
    review = invoke_json(["sender", "list", "--state", "REVIEW"], env)["items"]
    assert [r["operation_id"] for r in review] == [ops[0]]
    page = invoke_json(["sender", "list", "--limit", "1", "--after", f"{NS}:{ops[0]}"], env)
    assert [r["operation_id"] for r in page["items"]] == [ops[1]]
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


# --- NS by name (issue 7 item 7) and the list shape (issue 9 item 6) ---------------------------


@pytest.fixture
def named(biz: tuple[str, Engine]) -> Iterator[tuple[str, str, Engine, str, str]]:
    """A platform database with namespace 'acme' (its id is the rows' NS) and a business DB."""
    from orbit_tasks.platform import store as ps

    url, engine = biz
    with mariadb_database("orbit_scp") as purl, migrated_engine(purl, "platform") as platform:
        with platform.begin() as conn:
            ns_id = ps.create_namespace(conn, "acme").hex()
            ps.create_namespace(conn, "globex")
        yield purl, url, engine, ns_id, "acme"


def test_ns_is_a_name_resolved_through_the_platform_database(
    named: tuple[str, str, Engine, str, str],
) -> None:
    purl, url, engine, ns_id, name = named
    env = orbit_env(purl, url)
    (op,) = enqueue_many(engine, ns_id, [Q], 1)
    _review(engine, op)
    shown = invoke_json(["sender", "show", name, op], env)
    assert (shown["namespace_id"], shown["operation_id"]) == (ns_id, op)
    assert invoke_json(["sender", "show", ns_id, op], env)["operation_id"] == op
    listed = invoke_json(["sender", "list", "--namespace", name], env)
    assert [r["operation_id"] for r in listed["items"]] == [op]
    done = invoke_json(["sender", "requeue", name, op], env)
    assert done == {"namespace_id": ns_id, "operation_id": op, "state": "PENDING"}
    # the real console script, too
    res = run_orbit(["sender", "show", name, op, "--json"], env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["namespace_id"] == ns_id
    # a name the platform does not know: exit 4, one line naming it
    for cmd in (["sender", "show", "nope", op], ["sender", "requeue", "nope", op]):
        res = run_orbit(cmd, env)
        assert res.returncode == 4, (res.returncode, res.stderr)
        assert "namespace 'nope'" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    # a known namespace without this row is a missing row (exit 4 too), not a name problem
    missing = invoke_orbit(["sender", "show", "globex", op], env)
    assert missing.exit_code == 4 and "outbox row" in missing.stderr


def test_ns_name_through_the_credential_identity(
    world: World, biz: tuple[str, Engine], tmp_path: Path
) -> None:
    """On an application host without the platform database, a name resolves through the
    sender's credential (GET /v1/credential: its namespace's name and id)."""
    url, engine = biz
    (op,) = enqueue_many(engine, world.ns, world.queues, 1)
    with world.platform.connect() as conn:
        name = conn.execute(
            select(namespaces.c.name).where(namespaces.c.id == bytes.fromhex(world.ns))
        ).scalar_one()
    env = orbit_env(
        f"sqlite:///{tmp_path / 'absent' / 'platform.sqlite3'}",
        url,
        ORBIT_API_URL=world.api.base_url,
        ORBIT_API_TOKEN=world.token,
    )
    assert invoke_json(["sender", "show", name, op], env)["namespace_id"] == world.ns
    other = invoke_orbit(["sender", "show", "someone-else", op], env)
    assert other.exit_code == 4
    assert "namespace 'someone-else'" in other.stderr and name in other.stderr
    assert not (tmp_path / "absent").exists()  # no platform file was created by the lookup
    # neither source: exit 4 with what to do
    bare = orbit_env(f"sqlite:///{tmp_path / 'absent' / 'platform.sqlite3'}", url)
    res = invoke_orbit(["sender", "show", name, op], bare)
    assert res.exit_code == 4 and "32-hex" in res.stderr and "ORBIT_API_TOKEN" in res.stderr
    assert not (tmp_path / "absent").exists()


def test_list_pages_with_a_cursor(biz: tuple[str, Engine]) -> None:
    url, engine = biz
    env = orbit_env("sqlite:///unused.sqlite3", url)
    ops = sorted(enqueue_many(engine, NS, [Q], 5))
    first = invoke_json(["sender", "list", "--limit", "2"], env)
    assert set(first) == {"items", "next"}
    assert [r["operation_id"] for r in first["items"]] == ops[:2]
    assert first["next"] == f"{NS}:{ops[1]}"
    second = invoke_json(["sender", "list", "--limit", "2", "--after", first["next"]], env)
    assert [r["operation_id"] for r in second["items"]] == ops[2:4]
    last = invoke_json(["sender", "list", "--limit", "2", "--after", second["next"]], env)
    assert [r["operation_id"] for r in last["items"]] == ops[4:]
    assert last["next"] is None
    exact = invoke_json(["sender", "list", "--limit", "5"], env)
    assert exact["next"] is None and len(exact["items"]) == 5
    text_cut = invoke_orbit(["sender", "list", "--limit", "2"], env)
    assert text_cut.exit_code == 0
    assert f"more: next page with --after {NS}:{ops[1]}" in text_cut.stdout
    text_all = invoke_orbit(["sender", "list"], env)
    assert "more:" not in text_all.stdout and all(op in text_all.stdout for op in ops)
    empty = invoke_json(["sender", "list", "--state", "ACCEPTED"], env)
    assert empty == {"items": [], "next": None}


# --- issue 23: --dry-run writes nothing; the smaller refusals ----------------------------------


def _tables(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the outbox's four tables: compared before and after a command."""
    with engine.connect() as conn:
        return {
            table: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2"))]
            for table in ("sender_outbox", "sender_jobs", "sender_pruned", "sender_resolutions")
        }


def _refused(args: list[str], env: dict[str, str], code: int, *needles: str) -> None:
    done = invoke_orbit(args, env)
    assert done.exit_code == code, (args, done.exit_code, done.stdout, done.stderr)
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert all(n in done.stderr for n in needles), done.stderr


def test_dry_run_writes_nothing_in_any_sender_command(biz: tuple[str, Engine]) -> None:
    """Issue 23 item 7: ``requeue NS OP --dry-run`` moved the row to PENDING and ``resolve NS OP
    --dry-run`` recorded a resolution; only the --code forms honoured the flag. Every command
    that accepts --dry-run, each compared table by table before and after."""
    url, engine = biz
    env = orbit_env("sqlite:///unused.sqlite3", url)
    ops = sorted(enqueue_many(engine, NS, [Q], 3))
    for op in ops[:2]:
        _review(engine, op, last_code="REJECTED")
    with engine.begin() as conn:  # one old ACCEPTED row for the prune
        conn.execute(
            text(
                "UPDATE sender_outbox SET state='ACCEPTED', wake_at=NULL, last_code='ACCEPTED', "
                'task_id=operation_id, receipt_json=\'{"task_id": "x"}\', '
                "updated_at=updated_at - INTERVAL 8 DAY WHERE operation_id=:op"
            ),
            {"op": ops[2]},
        )
    commands = [
        (["sender", "requeue", NS, ops[0], "--dry-run"], "would requeue"),
        (["sender", "resolve", NS, ops[0], "--reason", "x", "--dry-run"], "would resolve"),
        (["sender", "requeue", "--code", "REJECTED", "--dry-run"], "2 would_requeue"),
        (["sender", "resolve", "--code", "REJECTED", "--reason", "x", "--dry-run"], "2 would"),
        (["sender", "prune", "--older-than", "7d", "--dry-run"], "would prune 1 rows"),
    ]
    for args, said in commands:
        before = _tables(engine)
        done = invoke_orbit(args, env)
        assert done.exit_code == 0 and said in done.stdout, (args, done.stdout, done.stderr)
        assert _tables(engine) == before, args
    as_json = invoke_json(["sender", "requeue", NS, ops[0], "--dry-run"], env)
    assert as_json["dry_run"] is True and as_json["state"] == "REVIEW"
    # the same refusals as without the flag (exit 3), nothing written either
    invoke_json(["sender", "resolve", NS, ops[1], "--reason", "handled"], env)
    before = _tables(engine)
    _refused(["sender", "resolve", NS, ops[1], "--reason", "x", "--dry-run"], env, 3, "already")
    _refused(["sender", "requeue", NS, ops[2], "--dry-run"], env, 3, "only REVIEW rows")
    assert _tables(engine) == before


def test_requeue_or_resolve_of_a_pruned_operation_says_it_was_pruned(
    biz: tuple[str, Engine],
) -> None:
    """Issue 23: ``requeue NS OP`` of a pruned operation said "does not exist" (exit 4) while
    ``show`` printed its record; now exit 3 naming the prune (also ``resolve``)."""
    url, engine = biz
    env = orbit_env("sqlite:///unused.sqlite3", url)
    (op,) = enqueue_many(engine, NS, [Q], 1)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sender_outbox SET state='ACCEPTED', wake_at=NULL, last_code='ACCEPTED', "
                'task_id=operation_id, receipt_json=\'{"task_id": "x"}\', '
                "updated_at=updated_at - INTERVAL 8 DAY"
            )
        )
    assert invoke_json(["sender", "prune", "--older-than", "7d"], env)["pruned"] == 1
    assert invoke_json(["sender", "show", NS, op], env)["pruned"] is True
    before = _tables(engine)
    _refused(["sender", "requeue", NS, op], env, 3, "was pruned", f"sender show {NS} {op}")
    _refused(["sender", "resolve", NS, op, "--reason", "x"], env, 3, "was pruned")
    _refused(["sender", "requeue", NS, "c3" * 16], env, 4, "does not exist")
    assert _tables(engine) == before


@pytest.mark.parametrize(
    ("args", "extra_env", "code", "needles"),
    [
        # --namespace "" was looked up and exited 4
        (["sender", "list", "--namespace", ""], {}, 2, ["namespace name ''"]),
        (["sender", "prune", "--older-than", "7d", "--namespace", ""], {}, 2, ["''"]),
        (["sender", "requeue", "--code", "REJECTED", "--namespace", ""], {}, 2, ["''"]),
        # a stray space was accepted and the prune ran
        (["sender", "prune", "--older-than", "1s "], {}, 2, ["'1s '", "without spaces"]),
        # the one-line rule let U+0085 (and other separators) through
        (["sender", "resolve", NS, "c3" * 16, "--reason", "a\u0085b"], {}, 2, ["U+0085"]),
        (["sender", "resolve", NS, "c3" * 16, "--reason", "a\u2028b"], {}, 2, ["U+2028"]),
        # ORBIT_OPERATOR was stored and printed verbatim: it could forge an "error:" line
        (
            ["sender", "resolve", NS, "c3" * 16, "--reason", "x"],
            {"ORBIT_OPERATOR": "alice\nerror: forged"},
            2,
            ["ORBIT_OPERATOR", "U+000A"],
        ),
        # the docs say at most 1000
        (["sender", "list", "--limit", "1001"], {}, 2, ["1001", "allowed 1..1000"]),
    ],
)
def test_smaller_refusals_are_one_line_exit_2_and_write_nothing(
    biz: tuple[str, Engine],
    args: list[str],
    extra_env: dict[str, str],
    code: int,
    needles: list[str],
) -> None:
    url, engine = biz
    env = orbit_env("sqlite:///unused.sqlite3", url, **extra_env)
    (op,) = enqueue_many(engine, NS, [Q], 1)
    _review(engine, op, last_code="REJECTED", updated_at=dt.datetime(2026, 1, 1))
    before = _tables(engine)
    _refused(args, env, code, *needles)
    assert _tables(engine) == before


def test_list_default_and_bound_are_the_documented_ones(biz: tuple[str, Engine]) -> None:
    """docs/cli.md: --limit default 50, at most 1000 (the code had 100 and 10,000)."""
    url, engine = biz
    env = orbit_env("sqlite:///unused.sqlite3", url)
    enqueue_many(engine, NS, [Q], 51)
    page = invoke_json(["sender", "list"], env)
    assert len(page["items"]) == 50 and page["next"] is not None
    assert len(invoke_json(["sender", "list", "--limit", "1000"], env)["items"]) == 51
