"""The four seed tables come out of the project's migrations exactly as the seed DDL (SPEC §2).

One database gets the seed DDL (collation-mapped for MariaDB), another the Alembic chains; the
information_schema views of the two must be identical for the four tables. The seed DDL is the
repository's own copy (``seeds/``), kept byte-identical to the upstream one beside a clone.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.migrate import render_sql, upgrade
from tests.support.db import mariadb_database
from tests.support.schema import REPO, SEEDS, UPSTREAM, load_seed

PLATFORM = ("orbit_archive_plans", "orbit_archive_jobs")
BUSINESS = ("sender_outbox", "sender_jobs")

QUERIES = {
    "tables": """SELECT TABLE_NAME, ENGINE, TABLE_COLLATION, TABLE_COMMENT
                 FROM information_schema.TABLES WHERE TABLE_SCHEMA=:s AND TABLE_NAME IN :t
                 ORDER BY TABLE_NAME""",
    "columns": """SELECT TABLE_NAME, ORDINAL_POSITION, COLUMN_NAME, COLUMN_DEFAULT, IS_NULLABLE,
                  DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, NUMERIC_PRECISION, DATETIME_PRECISION,
                  CHARACTER_SET_NAME, COLLATION_NAME, COLUMN_TYPE, COLUMN_KEY, EXTRA,
                  COLUMN_COMMENT, IS_GENERATED, GENERATION_EXPRESSION
                  FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=:s AND TABLE_NAME IN :t
                  ORDER BY TABLE_NAME, ORDINAL_POSITION""",
    "statistics": """SELECT TABLE_NAME, NON_UNIQUE, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME,
                     COLLATION, SUB_PART, NULLABLE, INDEX_TYPE, INDEX_COMMENT
                     FROM information_schema.STATISTICS WHERE TABLE_SCHEMA=:s AND TABLE_NAME IN :t
                     ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX""",
    "constraints": """SELECT TABLE_NAME, CONSTRAINT_NAME, CONSTRAINT_TYPE
                      FROM information_schema.TABLE_CONSTRAINTS
                      WHERE TABLE_SCHEMA=:s AND TABLE_NAME IN :t
                      ORDER BY TABLE_NAME, CONSTRAINT_NAME""",
    "checks": """SELECT TABLE_NAME, CONSTRAINT_NAME, LEVEL, CHECK_CLAUSE
                 FROM information_schema.CHECK_CONSTRAINTS
                 WHERE CONSTRAINT_SCHEMA=:s AND TABLE_NAME IN :t
                 ORDER BY TABLE_NAME, CONSTRAINT_NAME""",
}


def _schema_facts(engine: Engine, schema: str, tables: tuple[str, ...]) -> dict[str, list]:
    from sqlalchemy import bindparam

    facts: dict[str, list] = {}
    with engine.connect() as conn:
        for name, sql in QUERIES.items():
            stmt = text(sql).bindparams(bindparam("t", expanding=True))
            facts[name] = [tuple(r) for r in conn.execute(stmt, {"s": schema, "t": list(tables)})]
    return facts


@pytest.mark.mariadb
@pytest.mark.parametrize(
    ("chain", "seed_file", "tables"),
    [("platform", "orbit_archive.sql", PLATFORM), ("business", "sender_outbox.sql", BUSINESS)],
)
def test_migrations_match_seed_ddl(chain: str, seed_file: str, tables: tuple[str, ...]) -> None:
    with mariadb_database("orbit_seed") as seed_url, mariadb_database("orbit_mig") as mig_url:
        load_seed(seed_url, seed_file)
        engine = make_engine(mig_url)
        upgrade(engine, chain)  # type: ignore[arg-type]
        seed_engine = make_engine(seed_url)
        seed = _schema_facts(seed_engine, seed_url.rsplit("/", 1)[1], tables)
        mine = _schema_facts(engine, mig_url.rsplit("/", 1)[1], tables)
        seed_engine.dispose()
        engine.dispose()
    assert seed["tables"] and len(seed["columns"]) > 10 and seed["checks"]
    for view in QUERIES:
        assert mine[view] == seed[view], f"information_schema.{view} differs"


def test_offline_mysql8_ddl_keeps_0900_collations() -> None:
    ddl = render_sql("platform", "mysql+mysqldb://u@localhost/x")
    assert "COLLATE utf8mb4_0900_as_cs" in ddl
    assert "uca1400" not in ddl
    assert "CREATE TABLE orbit_archive_jobs" in ddl
    business = render_sql("business", "mysql+mysqldb://u@localhost/x")
    assert "COLLATE utf8mb4_0900_bin" in business
    assert "TIMESTAMPADD(HOUR,24,created_at)" in business


def test_mariadb_ddl_maps_collations() -> None:
    from sqlalchemy.dialects import mysql
    from sqlalchemy.schema import CreateTable

    from orbit_tasks.db.business_tables import sender_jobs
    from orbit_tasks.db.platform_tables import archive_plans

    mariadb = mysql.dialect(is_mariadb=True)
    plans = str(CreateTable(archive_plans).compile(dialect=mariadb))
    jobs = str(CreateTable(sender_jobs).compile(dialect=mariadb))
    assert "0900" not in plans + jobs
    assert "COLLATE utf8mb4_uca1400_as_cs" in plans
    assert "COLLATE utf8mb4_bin" in jobs


def test_repository_carries_the_seed_ddl_and_the_design() -> None:
    """A clone stands alone: the seed DDL and the design are inside the repository."""
    assert sorted(p.name for p in SEEDS.iterdir()) == ["orbit_archive.sql", "sender_outbox.sql"]
    assert "CREATE TABLE orbit_archive_jobs" in (SEEDS / "orbit_archive.sql").read_text("utf-8")
    design = (REPO / "docs" / "design.md").read_text("utf-8")
    assert "## 12. Operations: schema lifecycle, Flower, metrics, logs" in design


@pytest.mark.skipif(
    not (UPSTREAM / "seeds").is_dir(), reason="no upstream shared/ folder beside this clone"
)
def test_seed_copy_and_design_are_identical_to_upstream() -> None:
    upstream = sorted(p.name for p in (UPSTREAM / "seeds").iterdir() if p.suffix == ".sql")
    assert sorted(p.name for p in SEEDS.iterdir()) == upstream
    for name in upstream:
        assert (SEEDS / name).read_bytes() == (UPSTREAM / "seeds" / name).read_bytes(), name
    marker = "<!-- verbatim copy of SPEC.md below this line -->\n"
    design = (REPO / "docs" / "design.md").read_text("utf-8")
    assert design.split(marker, 1)[1] == (UPSTREAM / "SPEC.md").read_text("utf-8")
