"""The seed DDL as a test fixture, and snapshots that prove a refused command changed nothing.

``seeds/`` is the repository's copy of the seed DDL (byte-identical to ``../shared/seeds/`` when
that exists; ``test_schema_parity.py`` checks it). ``load_seed`` runs it on MariaDB the way an
operator creating the tables by hand would, with the 0900 collations mapped (SPEC §2).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from orbit_tasks.db.collation import map_collations_for_mariadb
from orbit_tasks.db.migrations.business import b0002_tables, b0003_tables
from orbit_tasks.db.migrations.frozen_0001 import create_statements

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "seeds"
UPSTREAM = REPO.parent / "shared"  # the design's folder beside a clone, when there is one
SEED_FILES = {"platform": "orbit_archive.sql", "business": "sender_outbox.sql"}


def seed_statements(seed_file: str) -> list[str]:
    """The ``CREATE TABLE`` statements of one seed file, 0900 collations mapped for MariaDB."""
    ddl = map_collations_for_mariadb((SEEDS / seed_file).read_text(encoding="utf-8"))
    out = []
    for stmt in re.split(r";\s*(?=CREATE TABLE|$)", ddl):
        body = "\n".join(line for line in stmt.splitlines() if not line.startswith("--"))
        if body.strip():
            out.append(body)
    return out


def load_seed(url: str, seed_file: str, edit: Callable[[str], str] = lambda s: s) -> None:
    """Create the seed tables on the MariaDB database ``url`` by hand (``edit`` may change the
    DDL first, e.g. to make one column differ)."""
    engine = create_engine(url + "?charset=utf8mb4")
    try:
        with engine.begin() as conn:
            for stmt in seed_statements(seed_file):
                conn.exec_driver_sql(edit(stmt).replace("%", "%%"))
    finally:
        engine.dispose()


def load_app_sender_tables(url: str) -> None:
    """What an application's own migration tool creates at the business head on MariaDB: the
    seed tables from the seed DDL, then the sender's own tables of revisions b0002 and b0003 (the
    DDL docs/schema.md prints), without any migration record of ours."""
    load_seed(url, SEED_FILES["business"])
    create_b0002_tables(url)
    create_b0003_tables(url)


def create_b0002_tables(url: str) -> None:
    """The tables revision b0002 adds (``sender_pruned``, ``sender_resolutions``), by hand."""
    _create_tables(url, b0002_tables.metadata)


def create_b0003_tables(url: str) -> None:
    """The table revision b0003 adds (``sender_holds``), by hand."""
    _create_tables(url, b0003_tables.metadata)


def _create_tables(url: str, metadata: Any) -> None:
    engine = create_engine(url + "?charset=utf8mb4")
    try:
        with engine.begin() as conn:
            for statement in create_statements(metadata):
                conn.execute(statement)
    finally:
        engine.dispose()


def mariadb_snapshot(url: str) -> dict[str, Any]:
    """Every table of the database with its ``SHOW CREATE TABLE``, its row count and a digest of
    all its rows (sorted): equal snapshots mean nothing was created, altered or written."""
    engine = create_engine(url + "?charset=utf8mb4")
    try:
        with engine.connect() as conn:
            tables = sorted(r[0] for r in conn.execute(text("SHOW TABLES")))
            snap: dict[str, Any] = {}
            for table in tables:
                ddl = conn.execute(text(f"SHOW CREATE TABLE `{table}`")).one()[1]
                query = text(f"SELECT * FROM `{table}`")
                rows = sorted(repr(tuple(r)) for r in conn.execute(query))
                digest = hashlib.sha256("\n".join(rows).encode()).hexdigest()
                snap[table] = (ddl, len(rows), digest)
            return snap
    finally:
        engine.dispose()
