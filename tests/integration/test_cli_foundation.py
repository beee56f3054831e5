"""The foundation's operator commands (SPEC §9) on SQLite and on the real MariaDB: happy paths,
exit codes of the error paths, ``--json`` output, and "bad input writes nothing"."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from orbit_tasks.archive.engine.volume import IDENTITY_FILE, read_identity, write_identity
from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import (
    archive_policies,
    archive_storages,
    credentials,
    namespaces,
    queues,
)
from orbit_tasks.ids import from_hex, new_id
from orbit_tasks.platform import store
from tests.support.cli import invoke_items, invoke_json, invoke_orbit, orbit_env, run_orbit

HEX32 = 32


@pytest.fixture
def env(any_platform_url: str) -> dict[str, str]:
    return orbit_env(any_platform_url, ORBIT_ACTOR="tester-ü")


@pytest.fixture
def db(any_platform_url: str) -> Iterator[Engine]:
    engine = make_engine(any_platform_url)
    yield engine
    engine.dispose()


def _count(engine: Engine, table: Any, *where: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar())


def _ok(args: list[str], env: dict[str, str]) -> str:
    result = invoke_orbit(args, env)
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return result.stdout.strip()


def _fails(args: list[str], env: dict[str, str], code: int, *needles: str) -> str:
    result = invoke_orbit(args, env)
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr)
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert result.stdout == ""
    return result.stderr


def test_namespace_create_list_duplicate_and_bad_name(env: dict[str, str], db: Engine) -> None:
    created = invoke_json(["namespace", "create", "acme"], env)
    assert created["name"] == "acme" and len(created["id"]) == HEX32
    plain = _ok(["namespace", "create", "globex"], env)
    assert len(plain) == HEX32 and int(plain, 16) >= 0

    _fails(["namespace", "create", "acme"], env, 3, "'acme'", "already exists")
    _fails(["namespace", "create", "Bad Name!"], env, 2, "'Bad Name!'", "a-z 0-9")
    _fails(["namespace", "create", "x" * 65], env, 2, "1-64 characters")

    listed = invoke_items(["namespace", "list"], env)
    assert [(n["name"], n["id"]) for n in listed] == [("acme", created["id"]), ("globex", plain)]
    assert all(n["state"] == "ACTIVE" and n["created_at"].endswith("Z") for n in listed)
    assert _count(db, namespaces) == 2
    table = _ok(["namespace", "list"], env)
    assert "acme" in table and "globex" in table and "NAME" in table
    acme = from_hex(created["id"])
    assert _count(db, audit_events, audit_events.c.namespace_id == acme) == 1


def test_unknown_namespace_is_exit_4_everywhere(env: dict[str, str], db: Engine) -> None:
    _fails(["policy", "set", "nope", "tasks", "--archive-after", "30d"], env, 4, "'nope'")
    _fails(["policy", "list", "nope"], env, 4, "'nope'")
    _fails(["queue", "create", "nope", "q1"], env, 4, "'nope'")
    _fails(["queue", "list", "nope"], env, 4, "'nope'")
    _fails(["credential", "create", "nope"], env, 4, "'nope'")
    _fails(["dev", "seed-history", "nope", "--kind", "events", "--roots", "1"], env, 4, "'nope'")
    missing = new_id().hex()
    _fails(["queue", "create", missing, "q1"], env, 4, missing)
    for table in (archive_policies, queues, credentials, audit_events):
        assert _count(db, table) == 0


def test_policy_set_appends_revisions_with_audit(env: dict[str, str], db: Engine) -> None:
    ns = invoke_json(["namespace", "create", "acme"], env)["id"]
    assert _ok(["policy", "set", "acme", "tasks", "--archive-after", "30d"], env) == "1"
    second = invoke_json(["policy", "set", ns, "tasks", "--archive-after", "7d"], env)
    assert second == {
        "namespace_id": ns,
        "kind": "tasks",
        "revision": 2,
        "archive_after_seconds": 7 * 86400,
    }
    assert (
        invoke_json(["policy", "set", "acme", "events", "--archive-after", "1h"], env)["revision"]
        == 1
    )

    rows = invoke_items(["policy", "list", "acme"], env)
    assert [(r["kind"], r["revision"], r["archive_after_seconds"]) for r in rows] == [
        ("events", 1, 3600),
        ("tasks", 1, 30 * 86400),
        ("tasks", 2, 7 * 86400),
    ]
    assert {r["created_by"] for r in rows} == {"tester-ü"}
    only_tasks = invoke_items(["policy", "list", "acme", "--kind", "tasks"], env)
    assert [r["revision"] for r in only_tasks] == [1, 2]

    with db.connect() as conn:
        audits = conn.execute(
            select(audit_events.c.actor, audit_events.c.detail_json).where(
                audit_events.c.action == "archive.policy.set"
            )
        ).all()
        latest = store.latest_policy(conn, from_hex(ns), "tasks")
    assert latest is not None and latest.revision == 2
    assert len(audits) == 3 and {a.actor for a in audits} == {"tester-ü"}
    details = sorted((json.loads(a.detail_json)["revision"], a.detail_json) for a in audits)
    assert json.loads(details[-1][1]) == {
        "archive_after_seconds": 604800,
        "kind": "tasks",
        "revision": 2,
    }


def test_policy_bad_input_is_exit_2_and_writes_nothing(env: dict[str, str], db: Engine) -> None:
    invoke_json(["namespace", "create", "acme"], env)
    before_audit = _count(db, audit_events)
    _fails(["policy", "set", "acme", "tasks", "--archive-after", "59m"], env, 2, "59m", "1h")
    _fails(["policy", "set", "acme", "tasks", "--archive-after", "3599s"], env, 2, "3599", "1h")
    _fails(["policy", "set", "acme", "tasks", "--archive-after", "7200"], env, 2, "needs a unit")
    _fails(["policy", "set", "acme", "taskz", "--archive-after", "2h"], env, 2, "'taskz'", "tasks")
    _fails(["policy", "set", "acme", "tasks", "--archive-after", "30x"], env, 2, "'30x'")
    _fails(["policy", "set", "acme", "tasks", "--archive-after", "36501d"], env, 2, "36500d")
    _fails(["policy", "list", "acme", "--kind", "nope"], env, 2, "'nope'")
    # bad input wins over an unknown namespace: nothing is even looked up
    _fails(["policy", "set", "nope", "taskz", "--archive-after", "2h"], env, 2, "'taskz'")
    assert _count(db, archive_policies) == 0
    assert _count(db, audit_events) == before_audit
    assert invoke_items(["policy", "list", "acme"], env) == []


def test_storage_init_list_and_identity_rules(
    env: dict[str, str], db: Engine, tmp_path: Path
) -> None:
    vol = tmp_path / "vol1"
    created = invoke_json(["storage", "init", str(vol), "--label", "disk-1 🚀"], env)
    assert created["status"] == "created" and created["label"] == "disk-1 🚀"
    ident = read_identity(vol)
    assert ident.storage_id.hex() == created["id"] and ident.label == "disk-1 🚀"
    doc = json.loads((vol / IDENTITY_FILE).read_text(encoding="utf-8"))
    assert doc == {"format": "orbit-volume/1", "label": "disk-1 🚀", "storage_id": created["id"]}

    # idempotent on the same volume (with or without the same label)
    assert _ok(["storage", "init", str(vol)], env) == created["id"]
    again = invoke_json(["storage", "init", str(vol), "--label", "disk-1 🚀"], env)
    assert (again["id"], again["status"]) == (created["id"], "existing")

    # another identity than the operator expects, or a volume inside a volume: conflict
    _fails(["storage", "init", str(vol), "--label", "disk-2"], env, 3, created["id"], "'disk-2'")
    _fails(["storage", "init", str(vol / "inner")], env, 3, "inside", created["id"])
    assert not (vol / "inner").exists()

    # an unreadable / foreign identity file: usage error, file left alone
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / IDENTITY_FILE).write_text('{"format":"something-else/9"}', encoding="utf-8")
    _fails(["storage", "init", str(bad)], env, 2, "orbit-volume/1")
    (bad / IDENTITY_FILE).write_text("not json", encoding="utf-8")
    _fails(["storage", "init", str(bad)], env, 2, "unreadable")
    assert (bad / IDENTITY_FILE).read_text(encoding="utf-8") == "not json"

    # label out of range: nothing written (no directory, no file, no row)
    _fails(["storage", "init", str(tmp_path / "v3"), "--label", "x" * 129], env, 2, "0..128")
    assert not (tmp_path / "v3").exists()
    a_file = tmp_path / "plain-file"
    a_file.write_text("x")
    _fails(["storage", "init", str(a_file)], env, 2, "not a directory")

    # a volume whose identity was written but never registered here (re-attach / crash between
    # the two steps): the next init registers that identity instead of minting another
    orphan_id = new_id()
    write_identity(tmp_path / "vol2", orphan_id, "moved")
    reattached = invoke_json(["storage", "init", str(tmp_path / "vol2")], env)
    assert (reattached["id"], reattached["status"]) == (orphan_id.hex(), "registered")
    assert read_identity(tmp_path / "vol2").storage_id == orphan_id

    listed = invoke_items(["storage", "list"], env)
    assert {(s["id"], s["label"]) for s in listed} == {
        (created["id"], "disk-1 🚀"),
        (orphan_id.hex(), "moved"),
    }
    assert _count(db, archive_storages) == 2
    with db.connect() as conn:
        assert store.storage_exists(conn, orphan_id)
    assert created["id"] in _ok(["storage", "list"], env)


def test_a_repeated_queues_option_adds_up(env: dict[str, str], db: Engine) -> None:
    """Issue 23: ``--queues a --queues b`` kept only ``b`` (a token narrower than asked for,
    silently); now the lists add up, and a bad entry in any of them writes nothing."""
    invoke_json(["namespace", "create", "acme"], env)
    ids = [invoke_json(["queue", "create", "acme", name], env)["id"] for name in "abc"]
    cred = invoke_json(
        ["credential", "create", "acme", "--queues", "a", "--queues", "b,c", "--queues", "a"], env
    )
    assert sorted(cred["queues"]) == sorted(ids)
    before = _count(db, credentials)
    _fails(["credential", "create", "acme", "--queues", "a", "--queues", ""], env, 2, "empty")
    _fails(["credential", "create", "acme", "--queues", "a", "--queues", "nope"], env, 4, "'nope'")
    assert _count(db, credentials) == before == 1


def test_queue_and_credential_lifecycle(env: dict[str, str], db: Engine) -> None:
    ns = invoke_json(["namespace", "create", "acme"], env)["id"]
    invoke_json(["namespace", "create", "other"], env)
    q1 = invoke_json(["queue", "create", "acme", "emails"], env)
    assert q1["name"] == "emails" and q1["namespace_id"] == ns and len(q1["id"]) == HEX32
    q2 = _ok(["queue", "create", ns, "reports"], env)
    _fails(["queue", "create", "acme", "emails"], env, 3, "'emails'", "already exists")
    _fails(["queue", "create", "acme", "Bad Queue"], env, 2, "'Bad Queue'")
    assert _ok(["queue", "create", "other", "emails"], env)  # names are per namespace
    assert [q["name"] for q in invoke_items(["queue", "list", "acme"], env)] == [
        "emails",
        "reports",
    ]

    cred = invoke_json(
        ["credential", "create", "acme", "--queues", f"emails,{q2}", "--label", "ci 𝄞"], env
    )
    token = cred["token"]
    assert cred["namespace_id"] == ns and sorted(cred["queues"]) == sorted([q1["id"], q2])
    everything = invoke_orbit(["credential", "create", "acme"], env)
    assert everything.exit_code == 0 and "token: orb_" in everything.stdout

    # bad input and unknown queues: nothing written
    before = _count(db, credentials)
    _fails(["credential", "create", "acme", "--queues", "emails,,reports"], env, 2, "empty")
    _fails(["credential", "create", "acme", "--queues", "nope"], env, 4, "'nope'")
    _fails(["credential", "create", "other", "--queues", "reports"], env, 4, "'reports'")
    _fails(["credential", "create", "acme", "--label", "y" * 129], env, 2, "0..128")
    assert _count(db, credentials) == before == 2

    # the token is stored only as its SHA-256: scan every column of every credential row
    with db.connect() as conn:
        rows = conn.execute(select(credentials)).all()
        found = store.lookup_credential(conn, token)
    for row in rows:
        for value in row:
            text = value.hex() if isinstance(value, bytes) else str(value)
            assert token not in text and token[4:] not in text
    digests = {r.token_sha256 for r in rows}
    assert hashlib.sha256(token.encode()).hexdigest() in digests
    assert found is not None and found.id.hex() == cred["id"]
    assert found.queue_ids is not None
    assert sorted(q.hex() for q in found.queue_ids) == sorted(cred["queues"])

    listed = invoke_items(["credential", "list", "acme"], env)
    assert {c["id"] for c in listed} >= {cred["id"]} and token not in json.dumps(listed)
    assert [c["label"] for c in listed if c["id"] == cred["id"]] == ["ci 𝄞"]

    # revoke: once ok, then 4; malformed id is a usage error
    assert "revoked" in _ok(["credential", "revoke", "acme", cred["id"]], env)
    _fails(["credential", "revoke", "acme", cred["id"]], env, 4, cred["id"])
    _fails(["credential", "revoke", "acme", new_id().hex()], env, 4, "does not exist")
    _fails(["credential", "revoke", "acme", "xyz"], env, 2, "'xyz'", "32 hexadecimal")
    with db.connect() as conn:
        assert store.lookup_credential(conn, token) is None
        actions = sorted(r[0] for r in conn.execute(select(audit_events.c.action)).all())
    assert actions.count("credential.create") == 2
    assert actions.count("credential.revoke") == 1
    assert actions.count("queue.create") == 3
    revoked = [c for c in invoke_items(["credential", "list", "acme"], env) if c["revoked_at"]]
    assert [c["id"] for c in revoked] == [cred["id"]]


def test_every_command_has_help(env: dict[str, str]) -> None:
    groups = {
        "namespace": ["create", "list"],
        "storage": ["init", "list"],
        "policy": ["set", "list"],
        "queue": ["create", "list"],
        "credential": ["create", "list", "revoke"],
        "dev": ["seed-history"],
    }
    for group, commands in groups.items():
        for command in commands:
            out = _ok([group, command, "--help"], env)
            assert "Usage:" in out and "--help" in out


def test_console_script_subprocess(env: dict[str, str], tmp_path: Path) -> None:
    """The real ``orbit`` script: JSON on stdout, messages on stderr, exit codes."""
    created = run_orbit(["namespace", "create", "acme", "--json"], env)
    assert created.returncode == 0, created.stderr
    ns = json.loads(created.stdout)
    dup = run_orbit(["namespace", "create", "acme"], env)
    assert dup.returncode == 3 and dup.stdout == "" and "already exists" in dup.stderr
    seeded = run_orbit(
        ["dev", "seed-history", "acme", "--kind", "tasks", "--roots", "50", "--json"], env
    )
    assert seeded.returncode == 0, seeded.stderr
    counts = json.loads(seeded.stdout)
    assert counts["namespace_id"] == ns["id"] and counts["roots"] == 50
    assert counts["queue_created"] is True
