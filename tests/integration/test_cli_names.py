"""Names cannot impersonate ids (issue 7 item 4), through the real ``orbit`` script.

NS and queue arguments take a name or a 32-hex id, and hex is read as an id first; a name of 32
hex characters could never be addressed, or would address another namespace. Such names are
refused with exit 2 and nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, insert, select

from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import namespaces, queues
from orbit_tasks.ids import new_id
from tests.support.cli import assert_one_line_error, orbit_env, run_orbit
from tests.support.db import migrated_engine


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
    with migrated_engine(url, "platform"):
        engine = make_engine(url)
        yield url, engine
        engine.dispose()


def _count(engine: Engine, table: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar())  # type: ignore[arg-type]


def _created(args: list[str], env: dict[str, str]) -> str:
    proc = run_orbit([*args, "--json"], env)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["id"])


def test_hex_names_are_refused_for_namespaces_and_queues(platform: tuple[str, Engine]) -> None:
    url, engine = platform
    env = orbit_env(url)
    acme = _created(["namespace", "create", "acme"], env)
    emails = _created(["queue", "create", "acme", "emails"], env)
    before = (_count(engine, namespaces), _count(engine, queues), _count(engine, audit_events))

    for name in (acme, "0123456789abcdef0123456789abcdef", new_id().hex()):
        refused = run_orbit(["namespace", "create", name], env)
        assert_one_line_error(refused, 2, repr(name), "32 hexadecimal", "id")
        refused = run_orbit(["queue", "create", "acme", name], env)
        assert_one_line_error(refused, 2, repr(name), "32 hexadecimal", "id")
    refused = run_orbit(["queue", "create", "acme", emails], env)  # a queue's own id
    assert_one_line_error(refused, 2, repr(emails))
    assert (
        _count(engine, namespaces),
        _count(engine, queues),
        _count(engine, audit_events),
    ) == before

    # one character more or less is a name like any other, and addressable as one
    for name in ("a" * 31, "b" * 33):
        _created(["namespace", "create", name], env)
        _created(["queue", "create", name, name], env)
        listed = run_orbit(["queue", "list", name, "--json"], env)
        assert [q["name"] for q in json.loads(listed.stdout)["items"]] == [name]


def test_a_hex_name_from_before_the_rule_stays_addressable(platform: tuple[str, Engine]) -> None:
    """Rows created before names were checked: NS falls back to the name when no id matches."""
    url, engine = platform
    legacy = "c" * 32
    with engine.begin() as conn:
        conn.execute(insert(namespaces).values(id=new_id(), name=legacy, state="ACTIVE"))
    listed = run_orbit(["queue", "list", legacy, "--json"], orbit_env(url))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"items": [], "next": None}
