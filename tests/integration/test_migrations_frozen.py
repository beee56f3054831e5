"""Every revision builds its tables from its own frozen copy (SPEC §12).

Today the frozen copies (p0001; b0001 + b0002) and the live table modules agree exactly (every
CREATE TABLE / CREATE INDEX for MySQL 8, MariaDB and SQLite); a later change of a live module
cannot change what an old revision creates (proved in a fresh interpreter that changes a live
table and renders both chains).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Index, MetaData
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Dialect

from orbit_tasks.db import business_tables, history_tables, platform_tables
from orbit_tasks.db.migrations.business import b0001_tables, b0002_tables
from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.migrations.platform import p0001_tables
from orbit_tasks.db.schema_check import head_revision, script_directory

MIGRATIONS = Path(__file__).resolve().parents[2] / "orbit_tasks" / "db" / "migrations"
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


def _ddl(metadata: MetaData, dialect: Dialect) -> list[str]:
    return [str(stmt.compile(dialect=dialect)) for stmt in create_statements(metadata)]


def _ddl_by_table(metadatas: list[MetaData], dialect: Dialect) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for metadata in metadatas:
        for stmt in create_statements(metadata):
            element: Any = stmt.element  # a Table (CREATE TABLE) or an Index (CREATE INDEX)
            table = element.table if isinstance(element, Index) else element
            out.setdefault(table.name, []).append(str(stmt.compile(dialect=dialect)))
    return out


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("chain", ["platform", "business"])
def test_frozen_revisions_agree_with_live_modules(chain: str, dialect: str) -> None:
    assert history_tables.tasks.metadata is platform_tables.metadata  # registered on it
    frozen, live = {
        "platform": ([p0001_tables.metadata], platform_tables.metadata),
        "business": ([b0001_tables.metadata, b0002_tables.metadata], business_tables.metadata),
    }[chain]
    assert [t for m in frozen for t in m.tables] == list(live.tables)
    if chain == "platform":
        assert _ddl(frozen[0], DIALECTS[dialect]) == _ddl(live, DIALECTS[dialect])
    assert _ddl_by_table(frozen, DIALECTS[dialect]) == _ddl_by_table([live], DIALECTS[dialect])


def test_business_head_is_b0002_on_b0001() -> None:
    assert head_revision("business") == "b0002"
    assert script_directory("business").get_revision("b0002").down_revision == "b0001"
    assert set(b0002_tables.metadata.tables) == {"sender_pruned", "sender_resolutions"}


def test_revision_files_never_import_the_live_table_modules() -> None:
    files = [
        *MIGRATIONS.glob("*/versions/*.py"),
        *MIGRATIONS.glob("*/?000?_tables.py"),
        MIGRATIONS / "frozen_0001.py",
    ]
    assert len(files) == 7
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
from orbit_tasks.db.platform_tables import archive_jobs
from orbit_tasks.db.business_tables import sender_jobs, sender_pruned
before = render_sql("platform", "mysql+mysqldb://u@h/x") + render_sql("business", "sqlite://")
archive_jobs.append_column(Column("added_later", Integer))
sender_jobs.append_column(Column("added_later", Integer))
sender_pruned.append_column(Column("added_later", Integer))
after = render_sql("platform", "mysql+mysqldb://u@h/x") + render_sql("business", "sqlite://")
assert "CREATE TABLE orbit_archive_jobs" in after and "CREATE TABLE sender_jobs" in after
assert "CREATE TABLE sender_pruned" in after
print("same" if before == after and "added_later" not in after else "changed")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "same", out.stderr
