"""CHECK clauses compare by meaning across the ways servers print them (pure logic)."""

from __future__ import annotations

import pytest

from orbit_tasks.db.sql_expr import (
    SqlSyntaxError,
    canonical,
    comparable,
    constraints_of_create_table,
    unescape_mysql_clause,
)
from tests.support.schema import SEEDS

# (as written in the seed, as MariaDB 10.11 reports it, as MySQL 8 reports it in
# information_schema: a parenthesis per operation, charset introducers, escaped quotes)
SAME = [
    (
        "kind IN ('tasks','workflows','events')",
        "`kind` in ('tasks','workflows','events')",
        r"(`kind` in (_utf8mb4\'tasks\',_utf8mb4\'workflows\',_utf8mb4\'events\'))",
    ),
    (
        "revision>0 AND interval_seconds BETWEEN 3600 AND 2592000 AND batch_size BETWEEN 1 AND 100",
        "`revision` > 0 and `interval_seconds` between 3600 and 2592000 and `batch_size` between "
        "1 and 100",
        "((`revision` > 0) and (`interval_seconds` between 3600 and 2592000) and "
        "(`batch_size` between 1 and 100))",
    ),
    (
        "(state='RUNNING' AND lease_id IS NOT NULL) OR (state<>'RUNNING' AND lease_id IS NULL)",
        "`state` = 'RUNNING' and `lease_id` is not null or `state` <> 'RUNNING' and "
        "`lease_id` is null",
        r"(((`state` = _utf8mb4\'RUNNING\') and (`lease_id` is not null)) or "
        r"((`state` <> _utf8mb4\'RUNNING\') and (`lease_id` is null)))",
    ),
    (
        "send_deadline_at>created_at AND send_deadline_at<=TIMESTAMPADD(HOUR,24,created_at)",
        "`send_deadline_at` > `created_at` and `send_deadline_at` <= `created_at` + interval 24 "
        "hour",
        "((`send_deadline_at` > `created_at`) and (`send_deadline_at` <= (`created_at` + "
        "interval 24 hour)))",
    ),
    (
        "receipt_json IS NULL OR JSON_VALID(receipt_json)",
        "`receipt_json` is null or json_valid(`receipt_json`)",
        "((`receipt_json` is null) or json_valid(`receipt_json`))",
    ),
    ("state<>'SENDING' OR lease_epoch>0", "`state` != 'SENDING' or `lease_epoch` > 0", None),
]


@pytest.mark.parametrize(("seed", "mariadb", "mysql8"), SAME)
def test_server_spellings_of_one_clause_compare_equal(
    seed: str, mariadb: str, mysql8: str | None
) -> None:
    assert canonical(seed) == canonical(mariadb)
    if mysql8 is not None:
        assert canonical(unescape_mysql_clause(mysql8)) == canonical(seed)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("a > 0 AND (b > 0 OR c > 0)", "(a > 0 AND b > 0) OR c > 0"),  # precedence is kept
        ("send_count<=100", "send_count<=101"),
        ("state IN ('A','B')", "state IN ('B','A')"),
        ("state = 'review'", "state = 'REVIEW'"),  # string literals keep their case
        ("x <= TIMESTAMPADD(HOUR,24,y)", "x <= TIMESTAMPADD(DAY,24,y)"),
        ("a IS NULL", "a IS NOT NULL"),
        ("a BETWEEN 1 AND 2", "a NOT BETWEEN 1 AND 2"),
        ("a - b - c", "a - (b - c)"),
    ],
)
def test_different_clauses_stay_different(a: str, b: str) -> None:
    assert canonical(a) != canonical(b)


def test_and_or_chains_are_flattened_but_not_reordered() -> None:
    assert canonical("(a=1 AND b=2) AND c=3") == canonical("a=1 AND (b=2 AND c=3)")
    assert canonical("a=1 AND b=2") != canonical("b=2 AND a=1")


def test_interval_spellings_are_one_form() -> None:
    want = canonical("TIMESTAMPADD(HOUR, 24, created_at)")
    assert canonical("created_at + INTERVAL 24 HOUR") == want
    assert canonical("INTERVAL 24 HOUR + created_at") == want
    assert canonical("DATE_ADD(created_at, INTERVAL 24 HOUR)") == want


def test_unknown_syntax_raises_and_comparable_falls_back_to_tokens() -> None:
    with pytest.raises(SqlSyntaxError):
        canonical("a > ")
    assert comparable("a >  ") == comparable("a >")
    assert comparable("CASE WHEN a THEN 1 END") == comparable("case  when a then 1 end")


def test_named_constraints_of_the_seed_ddl() -> None:
    ddl = (SEEDS / "sender_outbox.sql").read_text("utf-8").split("CREATE TABLE sender_jobs")[0]
    found = constraints_of_create_table(ddl)
    assert list(found.checks) == [
        "ck_sender_document",
        "ck_sender_receipt",
        "ck_sender_count",
        "ck_sender_state",
        "ck_sender_lease",
        "ck_sender_deadline",
    ]
    assert canonical(found.checks["ck_sender_count"]) == canonical(
        "send_count <= 100 AND lease_epoch = send_count"
    )
    sqlite = constraints_of_create_table(
        "CREATE TABLE t (a INT, CONSTRAINT uq_t UNIQUE (a, b), CHECK (a > 0), "
        "CONSTRAINT ck_t CHECK (a < 9))"
    )
    assert sqlite.uniques == {"uq_t": ("a", "b")}
    assert sqlite.checks == {"#1": "a > 0", "ck_t": "a < 9"}
