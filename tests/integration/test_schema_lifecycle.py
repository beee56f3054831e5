"""``orbit db upgrade|check|current`` and ``orbit sender db ...`` on real MariaDB and SQLite
(SPEC §12, docs/schema.md): adoption of tables created by hand from the seed DDL (no row
touched), refusal of a table that differs (exit 3, the database unchanged, no version table),
``check`` 0/1, ``current``, and upgrades racing each other.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text
from sqlalchemy.dialects import mysql

from orbit_tasks.db.business_tables import metadata as business_metadata
from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.migrate import UpgradeResult, alembic_config, upgrade
from orbit_tasks.db.migrations.business import b0001_tables, b0002_tables, b0003_tables
from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform import (
    p0001_tables,
    p0002_tables,
    p0003_tables,
    p0005_tables,
    p0006_tables,
)
from orbit_tasks.db.platform_tables import metadata as platform_metadata
from orbit_tasks.db.schema_check import head_revision
from orbit_tasks.sender import enqueue
from tests.support.cli import invoke_orbit, orbit_env, run_orbit
from tests.support.db import mariadb_database
from tests.support.schema import load_seed, mariadb_snapshot

# The platform chain's head and what the revisions after p0006 add (issues 27-30 each add a
# revision): the tests below name p0006's world and add these, so a new revision changes no test.
HEAD = head_revision("platform")
_UP_TO_P0006 = set().union(
    *(
        m.metadata.tables
        for m in (p0001_tables, p0002_tables, p0003_tables, p0005_tables, p0006_tables)
    )
)
LATER_TABLES = sorted(set(platform_metadata.tables) - _UP_TO_P0006)

NS, QUEUE = "0" * 31 + "1", "0" * 31 + "2"
PLAN_ROW = """INSERT INTO orbit_archive_plans (namespace_id, kind, policy_revision, storage_id,
    interval_seconds, batch_size, max_bytes, next_run_at)
    VALUES (UNHEX(REPEAT('ab', 16)), 'tasks', 1, UNHEX(REPEAT('cd', 16)), 3600, 10, 1048576,
            '2026-01-02 03:04:05.123456')"""
JOB_ROW = """INSERT INTO orbit_archive_jobs (namespace_id, id, kind, plan_revision, policy_revision,
    storage_id, batch_size, max_bytes, state, error_code, created_at, updated_at)
    VALUES (UNHEX(REPEAT('ab', 16)), UNHEX(REPEAT('ef', 16)), 'tasks', 1, 1,
            UNHEX(REPEAT('cd', 16)), 10, 1048576, 'FAILED', 'IO_ERROR',
            '2026-01-02 03:04:05.000001', '2026-01-02 03:04:06.999999')"""


def _enqueue_rows(url: str, n: int = 3) -> None:
    """Rows written by the real library, with 4-byte characters and exact numbers."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for i in range(n):
                enqueue(
                    conn,
                    namespace_id=NS,
                    queue_id=QUEUE,
                    operation_id=f"{i:032x}",
                    request=f'{{"total": 0.10000000000000000000{i}, "note": "😀 {i}"}}',
                    source_ref=f"orders/😀{i}",
                )
    finally:
        engine.dispose()


def _seed_with_rows(url: str, chain: str) -> None:
    load_seed(url, "orbit_archive.sql" if chain == "platform" else "sender_outbox.sql")
    if chain == "platform":
        engine = create_engine(url + "?charset=utf8mb4")
        with engine.begin() as conn:
            conn.execute(text(PLAN_ROW))
            conn.execute(text(JOB_ROW))
        engine.dispose()
    else:
        _enqueue_rows(url)


def _db_args(chain: str) -> list[str]:
    return ["db"] if chain == "platform" else ["sender", "db"]


@pytest.mark.mariadb
@pytest.mark.parametrize("chain", ["platform", "business"])
def test_upgrade_adopts_hand_created_seed_tables_without_touching_a_row(chain: str) -> None:
    with mariadb_database("orbit_adopt") as url:
        env = orbit_env(url, url)
        _seed_with_rows(url, chain)
        before = mariadb_snapshot(url)
        assert len(before) == 2 and all(count > 0 for _, count, _ in before.values())

        done = run_orbit([*_db_args(chain), "upgrade", "--json"], env)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        after = mariadb_snapshot(url)

        assert result["action"] == "adopted" and sorted(result["adopted"]) == sorted(before)
        assert len(result["created"]) == (23 + len(LATER_TABLES) if chain == "platform" else 3)
        for table, snap in before.items():
            assert after[table] == snap, f"{table} was changed"
        version = "orbit_alembic_version" if chain == "platform" else "sender_alembic_version"
        assert version in after
        human = run_orbit([*_db_args(chain), "upgrade"], env)
        assert human.returncode == 0
        assert "already current" in human.stdout
        check = run_orbit([*_db_args(chain), "check"], env)
        assert check.returncode == 0, check.stdout
        assert mariadb_snapshot(url) == after


@pytest.mark.mariadb
def test_upgrade_creates_only_what_is_missing() -> None:
    with mariadb_database("orbit_part") as url:
        load_seed(url, "sender_outbox.sql", lambda s: s if "sender_outbox (" in s else "DO 0")
        result = invoke_orbit(["sender", "db", "upgrade"], orbit_env(url, url))
        assert result.exit_code == 0, result.stderr
        assert result.stdout.strip() == (
            "business database: adopted 1 existing tables, created 4 tables; "
            "revision b0003 recorded"  # sender_jobs, b0002's pruned and resolutions, b0003's holds
        )


def _swap(old: str, new: str) -> Callable[[str], str]:
    def edit(ddl: str) -> str:
        return ddl.replace(old, new) if old in ddl else ddl

    return edit


CHANGES = [
    # (chain, edit of the seed DDL, the difference upgrade must report)
    (
        "platform",
        _swap("VARCHAR(16) NOT NULL COMMENT '创建时", "VARCHAR(32) NOT NULL COMMENT '创建时"),
        "orbit_archive_jobs:\n    column kind: type varchar(32), expected varchar(16)",
    ),
    (
        "platform",
        _swap("ix_archive_job_list(namespace_id,created_at,id)", "ix_archive_job_list(id)"),
        "index ix_archive_job_list: (id), expected (namespace_id, created_at, id)",
    ),
    (
        "platform",
        _swap("interval_seconds BETWEEN 3600 AND", "interval_seconds BETWEEN 60 AND"),
        "CHECK ck_archive_plan_config: `revision` > 0 and `policy_revision` > 0 and "
        "`interval_seconds` between 60",
    ),
    (
        "platform",
        _swap("active_job_id BINARY(16) NULL", "active_job_id BINARY(16) NOT NULL"),
        "column active_job_id: nullable NOT NULL, expected NULL",
    ),
    (
        "platform",
        _swap("DEFAULT 1 COMMENT '配置版本", "DEFAULT 2 COMMENT '配置版本"),
        "column revision: default 2, expected 1",
    ),
    (
        "business",
        _swap(
            "utf8mb4_bin NOT NULL COMMENT '待处理", "utf8mb4_general_ci NOT NULL COMMENT '待处理"
        ),
        "sender_jobs:\n    column source_ref: collation utf8mb4_general_ci, expected utf8mb4_bin",
    ),
    (
        "business",
        _swap("CONSTRAINT ck_sender_lease CHECK (state<>'SENDING' OR lease_epoch>0),\n", ""),
        "missing CHECK ck_sender_lease",
    ),
    (
        "business",
        _swap(
            "updated_at DATETIME(6) NOT NULL COMMENT '本地",
            "note TEXT NULL,\nupdated_at DATETIME(6) NOT NULL COMMENT '本地",
        ),
        "unexpected column note",
    ),
]


@pytest.mark.mariadb
@pytest.mark.parametrize(("chain", "edit", "difference"), CHANGES)
def test_upgrade_refuses_a_table_that_differs_and_changes_nothing(
    chain: str, edit: Callable[[str], str], difference: str
) -> None:
    with mariadb_database("orbit_diff") as url:
        env = orbit_env(url, url)
        load_seed(url, "orbit_archive.sql" if chain == "platform" else "sender_outbox.sql", edit)
        if chain == "business":
            _enqueue_rows(url, 1)
        before = mariadb_snapshot(url)

        result = invoke_orbit([*_db_args(chain), "upgrade"], env)

        assert result.exit_code == 3, (result.stdout, result.stderr)
        assert "differ from revision" in result.stderr and "nothing was changed" in result.stderr
        assert difference in result.stderr, result.stderr
        assert mariadb_snapshot(url) == before  # no version table, no table, no row
        check = invoke_orbit([*_db_args(chain), "check"], env)
        assert check.exit_code == 1 and difference in check.stdout


@pytest.mark.mariadb
def test_an_empty_version_table_left_by_older_releases_is_adopted() -> None:
    """Before adoption existed, `db upgrade` on seed tables failed with driver code 1050 and left
    an empty version table behind; such a database upgrades now."""
    with mariadb_database("orbit_vt") as url:
        load_seed(url, "orbit_archive.sql")
        engine = make_engine(url)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE TABLE orbit_alembic_version (version_num VARCHAR(32) NOT NULL, "
                    "CONSTRAINT orbit_alembic_version_pkc PRIMARY KEY (version_num))"
                )
            )
        result = upgrade(engine, "platform")
        assert (result.action, result.revision, len(result.adopted)) == ("adopted", HEAD, 2)
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM orbit_alembic_version")).all()
        engine.dispose()
        assert [v[0] for v in versions] == [HEAD]


@pytest.mark.mariadb
def test_check_and_current_through_the_life_of_a_database() -> None:
    with mariadb_database("orbit_chk") as url:
        env = orbit_env(url, url)
        current = invoke_orbit(["db", "current", "--json"], env)
        assert json.loads(current.stdout) == {
            "at_head": False,
            "database": "platform",
            "head": HEAD,
            "revision": None,
        }
        fresh = invoke_orbit(["db", "check"], env)
        assert fresh.exit_code == 1
        missing = "missing tables: orbit_archive_control_generation, orbit_archive_controls"
        assert missing in fresh.stdout
        assert invoke_orbit(["db", "upgrade"], env).stdout.strip() == (
            f"platform database: created {25 + len(LATER_TABLES)} tables; revision {HEAD} recorded"
        )
        assert invoke_orbit(["db", "current"], env).stdout.strip() == (
            f"platform database: revision {HEAD} (head)"
        )
        ok = invoke_orbit(["db", "check", "--json"], env)
        assert ok.exit_code == 0 and json.loads(ok.stdout)["ok"] is True

        engine = make_engine(url)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE orbit_tasks DROP INDEX ix_task_queue"))
        bad = invoke_orbit(["db", "check", "--json"], env)
        assert bad.exit_code == 1
        assert json.loads(bad.stdout)["differences"] == {
            "orbit_tasks": ["missing index ix_task_queue (namespace_id, queue_id, created_at)"]
        }
        with engine.begin() as conn:
            conn.execute(text("UPDATE orbit_alembic_version SET version_num = 'p0099'"))
        engine.dispose()
        newer = invoke_orbit(["db", "check"], env)
        assert newer.exit_code == 1 and "revision p0099 is recorded but unknown" in newer.stdout
        refused = invoke_orbit(["db", "upgrade"], env)
        assert refused.exit_code == 3 and "p0099" in refused.stderr


@pytest.mark.mariadb
def test_a_p0001_database_with_rows_upgrades_to_the_head() -> None:
    """A database migrated to p0001 by an earlier release, with rows in the seed and platform
    tables: `db check` asks for the upgrade, `db upgrade` creates the five control tables (p0002)
    and the S3 locations (p0003), widens the wait reasons (p0004), adds the final step's progress
    (p0005) and the recorded range ends (p0006) and records p0006, and no
    existing row changes."""
    with mariadb_database("orbit_p1") as url:
        engine = make_engine(url)
        with engine.connect() as conn, conn.begin():
            cfg = alembic_config("platform")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "p0001")
        with engine.begin() as conn:
            conn.execute(text(PLAN_ROW))
            conn.execute(text(JOB_ROW))
            conn.execute(
                text(
                    "INSERT INTO orbit_namespaces (id, name) VALUES (UNHEX(REPEAT('ab', 16)), 'n1')"
                )
            )
        engine.dispose()
        before = mariadb_snapshot(url)
        env = orbit_env(url, url)
        stale = invoke_orbit(["db", "check"], env)
        assert stale.exit_code == 1
        assert f"revision p0001 is recorded, head is {HEAD}; run `orbit db upgrade`" in stale.stdout
        done = run_orbit(["db", "upgrade", "--json"], env)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert (result["previous"], result["revision"], result["adopted"]) == ("p0001", HEAD, [])
        assert sorted(result["created"]) == [
            "orbit_archive_control_generation",
            "orbit_archive_controls",
            "orbit_archive_heartbeat",
            "orbit_archive_job_checks",
            "orbit_archive_job_ends",
            "orbit_archive_job_waits",
            "orbit_archive_object_storages",
            "orbit_archive_throttle_buckets",
            *LATER_TABLES,
        ]
        human = invoke_orbit(["db", "upgrade"], env)
        assert (
            human.stdout.strip()
            == f"platform database: already current (revision {HEAD}); nothing changed"
        )
        after = mariadb_snapshot(url)
        for table, snap in before.items():
            if table != "orbit_alembic_version":
                assert after[table] == snap, f"{table} was changed"
        assert invoke_orbit(["db", "check"], env).exit_code == 0


@pytest.mark.mariadb
def test_racing_upgrades_on_one_fresh_database_both_succeed() -> None:
    with mariadb_database("orbit_race") as url:
        engines = [make_engine(url), make_engine(url)]
        results: list[UpgradeResult] = []
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                results.append(upgrade(engines[i], "platform"))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for e in engines:
            e.dispose()
        assert not errors, errors
        assert sorted(r.action for r in results) == ["created", "current"]


# --- SQLite: the embedded default ------------------------------------------------------------


def _sqlite_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.parent.glob(path.name + "*"))}


def test_sqlite_adopts_tables_created_by_the_application_tool(tmp_path: Path) -> None:
    path = tmp_path / "business.sqlite3"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    business_metadata.create_all(engine)  # what an application's own migration tool runs
    engine.dispose()
    _enqueue_rows(url)
    env = orbit_env(f"sqlite:///{tmp_path / 'platform.sqlite3'}", url)
    assert invoke_orbit(["sender", "db", "check"], env).exit_code == 0  # by shape alone
    dump = _sqlite_rows(url)

    result = invoke_orbit(["sender", "db", "upgrade", "--json"], env)

    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["adopted"] == [
        "sender_jobs",
        "sender_outbox",
        "sender_pruned",  # b0002
        "sender_resolutions",
        "sender_holds",  # b0003
    ]
    assert _sqlite_rows(url) == dump
    assert invoke_orbit(["sender", "db", "current"], env).stdout.strip() == (
        "business database: revision b0003 (head)"
    )


def _sqlite_rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    engine = make_engine(url)
    with engine.connect() as conn:
        out = {
            t: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1, 2"))]
            for t in ("sender_outbox", "sender_jobs")
        }
    engine.dispose()
    return out


def test_sqlite_refuses_a_table_that_differs_and_leaves_the_file_unchanged(
    tmp_path: Path,
) -> None:
    from sqlalchemy.dialects import sqlite
    from sqlalchemy.schema import CreateTable

    path = tmp_path / "business.sqlite3"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    with engine.begin() as conn:
        for table in business_metadata.sorted_tables:
            ddl = str(CreateTable(table).compile(dialect=sqlite.dialect()))
            conn.exec_driver_sql(ddl.replace("send_count<=100", "send_count<=101"))
    engine.dispose()
    _enqueue_rows(url, 1)
    before = _sqlite_files(path)
    env = orbit_env(f"sqlite:///{tmp_path / 'platform.sqlite3'}", url)

    result = invoke_orbit(["sender", "db", "upgrade"], env)

    assert result.exit_code == 3
    assert re.search(r"CHECK ck_sender_count: .*101.*, expected .*100", result.stderr)
    assert _sqlite_files(path) == before  # byte for byte: no version table, nothing written
    check = invoke_orbit(["sender", "db", "check"], env)
    assert check.exit_code == 1 and "ck_sender_count" in check.stdout


def test_sqlite_platform_upgrade_check_and_a_changed_index(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
    env = orbit_env(url)
    assert invoke_orbit(["db", "upgrade"], env).exit_code == 0
    assert invoke_orbit(["db", "check"], env).exit_code == 0
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_task_queue")
        conn.exec_driver_sql("CREATE INDEX ix_task_queue ON orbit_tasks (namespace_id, queue_id)")
    engine.dispose()
    check = invoke_orbit(["db", "check"], env)
    assert check.exit_code == 1
    assert (
        "index ix_task_queue: (namespace_id, queue_id), expected (namespace_id, queue_id, "
        "created_at)" in check.stdout
    )


WAIT_ROW = """INSERT INTO orbit_archive_job_waits (namespace_id, job_id, reason, since, waited_us,
    updated_at) VALUES ({ns}, {job}, '{reason}', NULL, 7, '2026-01-02 03:04:05.000001')"""


@pytest.mark.parametrize("database", [pytest.param("mariadb", marks=pytest.mark.mariadb), "sqlite"])
def test_p0004_widens_the_wait_reasons_keeping_the_rows(database: str, tmp_path: Path) -> None:
    """A database at p0003 with wait rows: p0004 lets `replica_diverged` in (which p0003 refuses)
    and keeps every row; the downgrade removes the rows of that reason and refuses it again."""

    def blob(h: str) -> str:
        return f"x'{h * 16}'"

    def at(url: str, revision: str, direction: str = "upgrade") -> None:
        engine = make_engine(url)
        try:
            with engine.connect() as conn, conn.begin():
                cfg = alembic_config("platform")
                cfg.attributes["connection"] = conn
                getattr(command, direction)(cfg, revision)
        finally:
            engine.dispose()

    def run(url: str, sql: str) -> list[tuple[object, ...]]:
        engine = make_engine(url)
        try:
            with engine.begin() as conn:
                result = conn.execute(text(sql))
                return [tuple(r) for r in result] if result.returns_rows else []
        finally:
            engine.dispose()

    def check(url: str) -> None:
        at(url, "p0003")
        run(url, WAIT_ROW.format(ns=blob("ab"), job=blob("ef"), reason="replica_lag"))
        diverged = WAIT_ROW.format(ns=blob("ab"), job=blob("ef"), reason="replica_diverged")
        with pytest.raises(Exception, match="ck_archive_wait_reason|CHECK"):
            run(url, diverged)
        at(url, "head")
        run(url, diverged)
        rows = run(url, "SELECT reason, waited_us FROM orbit_archive_job_waits ORDER BY reason")
        assert rows == [("replica_diverged", 7), ("replica_lag", 7)]
        with pytest.raises(Exception, match="ck_archive_wait_reason|CHECK"):
            run(url, WAIT_ROW.format(ns=blob("ab"), job=blob("ee"), reason="nonsense"))
        at(url, "p0003", "downgrade")
        assert run(url, "SELECT reason FROM orbit_archive_job_waits") == [("replica_lag",)]
        with pytest.raises(Exception, match="ck_archive_wait_reason|CHECK"):
            run(url, diverged)

    if database == "sqlite":
        check(f"sqlite:///{tmp_path / 'p.sqlite3'}")
        return
    with mariadb_database("orbit_p4") as url:
        check(url)


def test_tables_of_b0002_made_by_hand_are_adopted_and_b0003_runs(tmp_path: Path) -> None:
    """An application whose tool created the four tables of b0002 (no record of ours) upgrades
    once b0003 exists: b0002's tables are adopted, b0003 records and creates sender_holds.
    Before, every later table was one group, so the missing sender_holds refused the upgrade."""
    url = f"sqlite:///{tmp_path / 'b2.sqlite3'}"
    engine = make_engine(url)
    b0001_tables.metadata.create_all(engine)
    b0002_tables.metadata.create_all(engine)
    engine.dispose()
    _enqueue_rows(url)
    dump = _sqlite_rows(url)
    env = orbit_env(f"sqlite:///{tmp_path / 'platform.sqlite3'}", url)
    result = invoke_orbit(["sender", "db", "upgrade", "--json"], env)
    assert result.exit_code == 0, result.stderr
    done = json.loads(result.stdout)
    assert done["adopted"] == [
        "sender_jobs",
        "sender_outbox",
        "sender_pruned",
        "sender_resolutions",
    ]
    assert done["created"] == ["sender_holds"] and done["revision"] == "b0003"
    assert {k: v for k, v in _sqlite_rows(url).items() if k != "sender_alembic_version"} == {
        k: v for k, v in dump.items() if k != "sender_alembic_version"
    }
    assert invoke_orbit(["sender", "db", "check"], env).exit_code == 0
    # b0003's table without b0002's: refused, nothing changed
    other = f"sqlite:///{tmp_path / 'b3.sqlite3'}"
    engine = make_engine(other)
    b0001_tables.metadata.create_all(engine)
    b0003_tables.metadata.create_all(engine)
    engine.dispose()
    before = (tmp_path / "b3.sqlite3").read_bytes()
    refused = invoke_orbit(["sender", "db", "upgrade"], orbit_env(env["ORBIT_DATABASE_URL"], other))
    assert refused.exit_code == 3, refused.stderr
    assert "revision after b0002 exist but those of b0002" in refused.stderr
    assert (tmp_path / "b3.sqlite3").read_bytes() == before


def test_schema_doc_carries_the_b0003_ddl() -> None:
    """docs/schema.md shows b0003's DDL for applications that own the sender tables."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text("utf-8")
    for st in create_statements(b0003_tables.metadata):
        text_ = str(st.compile(dialect=mysql.dialect())).strip().replace("\t", "    ")
        assert "\n".join(line.rstrip() for line in text_.splitlines()) + ";" in doc


def test_platform_tables_made_at_the_head_are_adopted_once_and_p0004_runs(tmp_path: Path) -> None:
    """Every platform table created by hand as the head defines it (no record): each is adopted
    once -- p0004 replaces p0002's waits table, it adds none, and is adopted with p0005, whose
    table exists -- the head (p0006) is recorded and the waits accept `replica_diverged`."""
    url = f"sqlite:///{tmp_path / 'p.sqlite3'}"
    engine = make_engine(url)
    try:
        platform_metadata.create_all(engine)
        result = upgrade(engine, "platform")
        assert (result.action, result.revision) == ("adopted", HEAD)
        assert sorted(result.adopted) == sorted(set(result.adopted))
        assert "orbit_archive_job_waits" in result.adopted
        with engine.begin() as conn:
            conn.execute(
                text(WAIT_ROW.format(ns="x'" + "ab" * 16 + "'", job="x'" + "ef" * 16 + "'",
                                     reason="replica_diverged"))
            )  # fmt: skip
    finally:
        engine.dispose()


def test_platform_tables_made_as_p0003_left_them_adopt_p0003_and_the_later_ones_run(
    tmp_path: Path,
) -> None:
    """Every platform table of the head but p0005's and p0006's made by hand: p0003 is recorded
    (the waits table as the head defines it is adopted with p0002's), then p0004 runs on it and
    p0005 and p0006 create their tables; the head is recorded."""
    url = f"sqlite:///{tmp_path / 'p.sqlite3'}"
    engine = make_engine(url)
    try:
        platform_metadata.create_all(
            engine,
            tables=[
                t
                for n, t in platform_metadata.tables.items()
                if n not in ("orbit_archive_job_checks", "orbit_archive_job_ends", *LATER_TABLES)
            ],
        )
        result = upgrade(engine, "platform")
        assert (result.action, result.revision) == ("adopted", HEAD)
        assert "orbit_archive_job_waits" in result.adopted
        made = {"orbit_archive_job_checks", "orbit_archive_job_ends", *LATER_TABLES}
        assert made <= set(result.created)
        assert "orbit_archive_job_waits" not in result.created
        with engine.begin() as conn:
            conn.execute(
                text(WAIT_ROW.format(ns="x'" + "ab" * 16 + "'", job="x'" + "ef" * 16 + "'",
                                     reason="replica_diverged"))
            )  # fmt: skip
    finally:
        engine.dispose()
