"""Normalising what servers report (pure logic).

MariaDB is exercised on the real server (tests/integration/test_schema_lifecycle.py). MySQL 8 is
not available on the test machines, so its documented reporting differences are written out here
as ``information_schema`` rows: no integer display widths (except ``tinyint(1)``), bare literal
defaults, ``DEFAULT_GENERATED`` on expression defaults, the ``0900`` collations, CHECK clauses
with a parenthesis per operation, charset introducers and backslash-escaped quotes.
"""

from __future__ import annotations

from types import SimpleNamespace as Row

from sqlalchemy.dialects import mysql

from orbit_tasks.db.platform_tables import archive_jobs, archive_plans
from orbit_tasks.db.schema_facts import (
    expected_mysql_facts,
    mysql_reported_facts,
    normalize_default,
    normalize_type,
    table_differences,
)

MYSQL8 = mysql.dialect()
MYSQL8.server_version_info = (8, 0, 36)
MARIADB = mysql.dialect(is_mariadb=True)


def col(name: str, type_: str, *, null: bool = False, default: str | None = None, **kw: str) -> Row:
    text_type = type_.startswith(("varchar", "char"))
    return Row(
        COLUMN_NAME=name,
        COLUMN_TYPE=type_,
        IS_NULLABLE="YES" if null else "NO",
        COLUMN_DEFAULT=default,
        EXTRA=kw.get("extra", ""),
        CHARACTER_SET_NAME="utf8mb4" if text_type else None,
        COLLATION_NAME="utf8mb4_0900_as_cs" if text_type else None,
        COLUMN_COMMENT=kw.get("comment", ""),
    )


def idx(name: str, *cols: str, unique: bool = False) -> list[Row]:
    return [
        Row(INDEX_NAME=name, NON_UNIQUE=0 if unique else 1, COLUMN_NAME=c, SUB_PART=None,
            COLLATION="A", INDEX_TYPE="BTREE")
        for c in cols
    ]  # fmt: skip


NOW = {"default": "CURRENT_TIMESTAMP(6)", "extra": "DEFAULT_GENERATED"}


def mysql8_plans_rows() -> dict[str, object]:
    """``orbit_archive_plans`` as MySQL 8.0 reports it after running the seed DDL."""
    comments = {c.name: c.comment for c in archive_plans.columns}
    cols = [
        col("namespace_id", "binary(16)"),
        col("kind", "varchar(16)"),
        col("revision", "bigint unsigned", default="1"),
        col("enabled", "tinyint(1)", default="0"),
        col("policy_revision", "bigint unsigned"),
        col("storage_id", "binary(16)"),
        col("interval_seconds", "int unsigned"),
        col("batch_size", "int unsigned"),
        col("max_bytes", "bigint unsigned"),
        col("next_run_at", "datetime(6)"),
        col("active_job_id", "binary(16)", null=True),
        col("created_at", "datetime(6)", **NOW),
        col("updated_at", "datetime(6)", **NOW),
    ]
    for c in cols:
        c.COLUMN_COMMENT = comments[c.COLUMN_NAME]
    checks = [
        Row(CONSTRAINT_NAME="ck_archive_plan_kind", ENFORCED="YES",
            CHECK_CLAUSE=r"(`kind` in (_utf8mb4\'tasks\',_utf8mb4\'workflows\',_utf8mb4\'events\',"
            r"_utf8mb4\'audit\',_utf8mb4\'deliveries\',_utf8mb4\'inbox\',_utf8mb4\'idempotency\'))"),
        Row(CONSTRAINT_NAME="ck_archive_plan_config", ENFORCED="YES",
            CHECK_CLAUSE="((`revision` > 0) and (`policy_revision` > 0) and (`interval_seconds` "
            "between 3600 and 2592000) and (`batch_size` between 1 and 100) and (`max_bytes` "
            "between 1048576 and 1073741824))"),
    ]  # fmt: skip
    return {
        "table_row": Row(
            ENGINE="InnoDB",
            TABLE_COLLATION="utf8mb4_0900_as_cs",
            TABLE_COMMENT=archive_plans.comment,
        ),
        "column_rows": cols,
        "index_rows": idx("PRIMARY", "namespace_id", "kind", unique=True)
        + idx("ix_archive_plan_due", "storage_id", "enabled", "next_run_at"),
        "check_rows": checks,
    }


def test_mysql8_report_of_the_seed_table_matches() -> None:
    expected = expected_mysql_facts(archive_plans, MYSQL8, "utf8mb4_0900_ai_ci")
    actual = mysql_reported_facts("orbit_archive_plans", mariadb=False, **mysql8_plans_rows())  # type: ignore[arg-type]
    assert table_differences(expected, actual) == []


def test_mysql8_report_with_changes_lists_each() -> None:
    rows = mysql8_plans_rows()
    cols = rows["column_rows"]
    cols[1].COLUMN_TYPE = "varchar(32)"  # type: ignore[index]
    cols[12].EXTRA = "DEFAULT_GENERATED on update CURRENT_TIMESTAMP(6)"  # type: ignore[index]
    cols[3].COLUMN_DEFAULT = "1"  # type: ignore[index]
    rows["check_rows"][1].ENFORCED = "NO"  # type: ignore[index]
    rows["index_rows"] = rows["index_rows"][:-1]  # type: ignore[index]
    expected = expected_mysql_facts(archive_plans, MYSQL8, "utf8mb4_0900_ai_ci")
    diffs = table_differences(
        expected,
        mysql_reported_facts("orbit_archive_plans", mariadb=False, **rows),  # type: ignore[arg-type]
    )
    assert diffs[:3] == [
        "column kind: type varchar(32), expected varchar(16)",
        "column enabled: default 1, expected 0",
        "column updated_at: extra 'on update current_timestamp(6)', expected ''",
    ]
    assert any(d.startswith("index ix_archive_plan_due: (storage_id, enabled)") for d in diffs)
    assert any("ck_archive_plan_config" in d and "NOT ENFORCED" in d for d in diffs)
    assert len(diffs) == 5


def test_literal_defaults_mysql8_bare_mariadb_quoted() -> None:
    from orbit_tasks.db.schema_facts import mysql_reported_default

    assert mysql_reported_default("PENDING", "varchar(16)", "", mariadb=False) == "'PENDING'"
    assert mysql_reported_default("'PENDING'", "varchar(16)", "", mariadb=True) == "'PENDING'"
    assert mysql_reported_default("", "char(64)", "", mariadb=False) == "''"
    assert mysql_reported_default("0", "bigint unsigned", "", mariadb=False) == "0"
    assert mysql_reported_default("NULL", "binary(16)", "", mariadb=True) is None
    expected = expected_mysql_facts(archive_jobs, MARIADB, "utf8mb4_general_ci")
    defaults = {c.name: c.default for c in expected.columns}
    assert defaults["state"] == "'PENDING'" and defaults["last_sha256"] == "''"
    assert defaults["created_at"] == "current_timestamp(6)" and defaults["kind"] is None


def test_types_and_collations() -> None:
    assert normalize_type("int(10) unsigned") == "int unsigned"
    assert normalize_type("INTEGER UNSIGNED") == "int unsigned"
    assert normalize_type("bigint(20) unsigned") == "bigint unsigned"
    assert normalize_type("BOOL") == normalize_type("tinyint(1)") == "tinyint(1)"
    assert normalize_type("tinyint(4)") == "tinyint"
    assert normalize_type("MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin") == "mediumtext"
    facts = expected_mysql_facts(archive_plans, MARIADB, "utf8mb4_general_ci")
    kind = next(c for c in facts.columns if c.name == "kind")
    assert (kind.charset, kind.collation) == ("utf8mb4", "utf8mb4_uca1400_as_cs")
    assert facts.options["collation"] == "utf8mb4_uca1400_as_cs"
    assert normalize_default("(strftime('%Y', 'now'))") == "strftime('%Y', 'now')"
