"""Every revision builds its tables from its own frozen copy (SPEC §12).

Today the frozen copies (p0001 + ... + p0006 for the platform chain, b0001 +
b0002 + b0003 for the business chain) and the live table modules agree exactly (every CREATE
TABLE / CREATE INDEX for MySQL 8, MariaDB and SQLite); a later change of a live module cannot
change what an old revision creates (proved in a fresh interpreter that changes live tables and
renders both chains).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import MetaData, Table
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Dialect

from orbit_tasks.db import business_tables, history_tables, platform_tables
from orbit_tasks.db.migrations.business import b0001_tables, b0002_tables, b0003_tables
from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform import (
    p0001_tables,
    p0002_tables,
    p0003_tables,
    p0004_tables,
    p0005_tables,
    p0006_tables,
)
from orbit_tasks.db.schema_check import head_revision, script_directory

MIGRATIONS = Path(__file__).resolve().parents[2] / "orbit_tasks" / "db" / "migrations"
# The platform revisions after p0006 (issues 27-30: each adds tables only), in chain order;
# found on disk, so that a new revision needs no change here (test_later_revisions_...).
LATER = [
    importlib.import_module(f"orbit_tasks.db.migrations.platform.{p.stem}")
    for p in sorted((MIGRATIONS / "platform").glob("p0*_tables.py"))
    if int(p.stem[1:5]) > 6
]
DIALECTS: dict[str, Dialect] = {
    "mysql8": mysql.dialect(),
    "mariadb": mysql.dialect(is_mariadb=True),
    "sqlite": sqlite.dialect(),
}
LIVE_MODULES = {
    "orbit_tasks.db.platform_tables",
    "orbit_tasks.db.history_tables",
    "orbit_tasks.db.business_tables",
    "orbit_tasks.db.types",
}


def _ddl(metadata: MetaData, dialect: Dialect) -> dict[str, list[str]]:
    """Table name -> its CREATE TABLE and CREATE INDEX statements."""
    out: dict[str, list[str]] = {}
    for stmt in create_statements(metadata):
        table = getattr(stmt.target, "table", stmt.target)  # an index's table, or the table
        out.setdefault(table.name, []).append(str(stmt.compile(dialect=dialect)))
    return out


FROZEN = {
    "platform": (
        p0001_tables.metadata,
        p0002_tables.metadata,
        p0003_tables.metadata,
        p0005_tables.metadata,
        p0006_tables.metadata,
        *(m.metadata for m in LATER),
    ),
    # then the tables a later revision replaced, as that revision leaves them
    "platform+": (p0004_tables.metadata,),
    "business": (b0001_tables.metadata, b0002_tables.metadata, b0003_tables.metadata),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("chain", ["platform", "business"])
def test_frozen_revisions_agree_with_live_modules(chain: str, dialect: str) -> None:
    assert history_tables.tasks.metadata is platform_tables.metadata  # registered on it
    live = {"platform": platform_tables.metadata, "business": business_tables.metadata}[chain]
    frozen: dict[str, list[str]] = {}
    for revision in FROZEN[chain]:
        ddl = _ddl(revision, DIALECTS[dialect])
        assert not set(ddl) & set(frozen), "a table created by two revisions"
        frozen.update(ddl)
    for revision in FROZEN.get(f"{chain}+", ()):
        ddl = _ddl(revision, DIALECTS[dialect])
        assert set(ddl) <= set(frozen), "a replacing revision replaces existing tables only"
        frozen.update(ddl)
    assert sorted(frozen) == sorted(live.tables)
    assert frozen == _ddl(live, DIALECTS[dialect])


def test_p0002_creates_only_new_tables() -> None:
    """p0002 adds tables; it never recreates a p0001 (or seed) table."""
    assert not set(p0002_tables.metadata.tables) & set(p0001_tables.metadata.tables)
    assert "orbit_archive_heartbeat" in p0002_tables.metadata.tables


def test_p0003_creates_only_new_tables() -> None:
    """p0003 (issue 18) adds the S3 locations; it never recreates an earlier table."""
    earlier = set(p0001_tables.metadata.tables) | set(p0002_tables.metadata.tables)
    assert not set(p0003_tables.metadata.tables) & earlier
    assert list(p0003_tables.metadata.tables) == ["orbit_archive_object_storages"]


def test_p0004_replaces_the_wait_reasons_check_only() -> None:
    """p0004 (issue 24) changes ``ck_archive_wait_reason`` of p0002's waits table to accept
    ``replica_diverged``; every other part of the table is p0002's."""
    assert list(p0004_tables.metadata.tables) == ["orbit_archive_job_waits"]
    old = p0002_tables.metadata.tables["orbit_archive_job_waits"]
    new = p0004_tables.metadata.tables["orbit_archive_job_waits"]
    for dialect in DIALECTS.values():
        before, after = (_ddl(_alone(t), dialect)["orbit_archive_job_waits"] for t in (old, new))
        assert after == [
            before[0].replace(
                "'replica_lag','window')", "'replica_lag','window','replica_diverged')"
            )
        ]
    assert script_directory("platform").get_revision("p0004").down_revision == "p0003"


def test_p0005_creates_only_the_job_checks() -> None:
    """p0005 (issue 24 item 4) adds the final step's progress; it never recreates an earlier
    table."""
    earlier = set().union(
        *(m.tables for m in (p0001_tables.metadata, p0002_tables.metadata, p0003_tables.metadata))
    )
    assert not set(p0005_tables.metadata.tables) & earlier
    assert list(p0005_tables.metadata.tables) == ["orbit_archive_job_checks"]
    assert script_directory("platform").get_revision("p0005").down_revision == "p0004"


def test_p0006_creates_only_new_tables() -> None:
    """p0006 (issue 25) adds the recorded ends of job ranges; it never recreates an earlier
    table (the seed's orbit_archive_jobs keeps its columns)."""
    earlier = set(p0001_tables.metadata.tables) | set(p0002_tables.metadata.tables)
    earlier |= set(p0003_tables.metadata.tables)
    assert not set(p0006_tables.metadata.tables) & earlier
    assert list(p0006_tables.metadata.tables) == ["orbit_archive_job_ends"]
    assert script_directory("platform").get_revision("p0006").down_revision == "p0005"


def test_later_revisions_add_tables_only_one_after_the_other() -> None:
    """Each revision after p0006 adds tables only (never one an earlier revision made), revises
    the one before it, and the last is the head."""
    earlier = set().union(*(m.tables for m in FROZEN["platform"][:5]))
    previous = "p0006"
    for module in LATER:
        assert not set(module.metadata.tables) & earlier, module.REVISION
        earlier |= set(module.metadata.tables)
        revision = script_directory("platform").get_revision(module.REVISION)
        assert revision.down_revision == previous, module.REVISION
        previous = module.REVISION
    assert head_revision("platform") == previous


def _alone(table: Table) -> MetaData:
    one = MetaData()
    table.to_metadata(one)
    return one


def test_business_head_is_b0003_on_b0002_on_b0001() -> None:
    assert head_revision("business") == "b0003"
    assert script_directory("business").get_revision("b0003").down_revision == "b0002"
    assert script_directory("business").get_revision("b0002").down_revision == "b0001"
    assert set(b0002_tables.metadata.tables) == {"sender_pruned", "sender_resolutions"}
    assert set(b0003_tables.metadata.tables) == {"sender_holds"}


def test_revision_files_never_import_the_live_table_modules() -> None:
    files = [
        *MIGRATIONS.glob("*/versions/*.py"),
        *MIGRATIONS.glob("*/?00??_tables.py"),
        MIGRATIONS / "frozen_0001.py",
    ]
    assert len(files) == 19 + 2 * len(LATER)
    for path in files:
        imported = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported |= {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
        assert not imported & LIVE_MODULES, (path.name, imported & LIVE_MODULES)


def test_changing_a_live_table_does_not_change_the_revisions() -> None:
    script = """
from sqlalchemy import Column, Integer
from orbit_tasks.db.migrate import render_sql
from orbit_tasks.db.platform_tables import archive_controls, archive_jobs
from orbit_tasks.db.business_tables import sender_jobs, sender_pruned
before = render_sql("platform", "mysql+mysqldb://u@h/x") + render_sql("business", "sqlite://")
archive_jobs.append_column(Column("added_later", Integer))
archive_controls.append_column(Column("added_later", Integer))
sender_jobs.append_column(Column("added_later", Integer))
sender_pruned.append_column(Column("added_later", Integer))
after = render_sql("platform", "mysql+mysqldb://u@h/x") + render_sql("business", "sqlite://")
assert "CREATE TABLE orbit_archive_jobs" in after and "CREATE TABLE sender_jobs" in after
assert "CREATE TABLE sender_pruned" in after
assert "CREATE TABLE orbit_archive_controls" in after
print("same" if before == after and "added_later" not in after else "changed")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "same", out.stderr
