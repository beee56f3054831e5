"""compose/ runs MySQL 8.0 by default (the seeds' own server). No MySQL 8 server runs here, so
this proves it offline: the DDL the migrations render for MySQL 8 (``render_sql``, Alembic's
``--sql`` mode with the MySQL dialect) keeps the ``utf8mb4_0900_*`` collations and declares every
seed table exactly as ``seeds/*.sql`` does -- columns in order with type, unsigned, character
set, collation, nullability, default and comment; primary key; indexes; CHECK constraints; and
the table options -- compared element by element after normalising only spelling (whitespace,
``BOOL``/``BOOLEAN``, ``INT``/``INTEGER``, ``KEY`` inline vs ``CREATE INDEX``, keyword case)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from orbit_tasks.db.migrate import render_sql
from tests.support.schema import SEEDS

MYSQL8_URL = "mysql+mysqldb://u@localhost/x"
SEED_TABLES = {
    "platform": ("orbit_archive.sql", ("orbit_archive_plans", "orbit_archive_jobs")),
    "business": ("sender_outbox.sql", ("sender_outbox", "sender_jobs")),
}


_QUOTED = r"'(?:[^'\\]|\\.|'')*'"
_TOKEN = re.compile(rf"{_QUOTED}|[A-Za-z_][A-Za-z0-9_]*\([^)]*\)|[^\s,()]+|\(|\)|,")


def _outside_quotes(text: str, fn: Any) -> str:
    """Apply ``fn`` to the parts of ``text`` outside single-quoted strings."""
    parts = re.split(rf"({_QUOTED})", text)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def _norm_expr(text: str) -> str:
    def fn(part: str) -> str:
        part = re.sub(r"\s+", " ", part.upper())
        part = re.sub(r"\s*([(),])\s*", r"\1", part)
        return part

    return _outside_quotes(text, fn).strip()


def _strip_comments(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith(("--", "#")))


def _split_top(text: str, sep: str) -> list[str]:
    """Split at ``sep`` outside quotes and parentheses."""
    out, depth, quote, start = [], 0, False, 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == "'":
                quote = False
        elif c == "'":
            quote = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
        i += 1
    out.append(text[start:])
    return [p.strip() for p in out if p.strip()]


def _column(element: str) -> tuple[Any, ...]:
    tokens = _TOKEN.findall(element)
    name, type_ = tokens[0].lower(), tokens[1].upper()
    type_ = {"BOOL": "BOOLEAN", "INTEGER": "INT"}.get(type_, type_)
    type_ = re.sub(r"^INTEGER\(", "INT(", type_)
    attrs: dict[str, Any] = {"unsigned": False, "nullable": True, "default": None, "comment": None}
    rest = tokens[2:]
    i = 0
    while i < len(rest):
        word = rest[i].upper()
        if word == "UNSIGNED":
            attrs["unsigned"] = True
        elif word == "CHARACTER" and rest[i + 1].upper() == "SET":
            attrs["charset"] = rest[i + 2].lower()
            i += 2
        elif word == "COLLATE":
            attrs["collate"] = rest[i + 1].lower()
            i += 1
        elif word == "NOT" and rest[i + 1].upper() == "NULL":
            attrs["nullable"] = False
            i += 1
        elif word == "NULL":
            attrs["nullable"] = True
        elif word == "DEFAULT":
            value = rest[i + 1]
            attrs["default"] = value if value.startswith("'") else value.upper()
            i += 1
        elif word == "COMMENT":
            attrs["comment"] = rest[i + 1]
            i += 1
        else:
            raise AssertionError(f"unparsed column attribute {rest[i]!r} in {element!r}")
        i += 1
    return ("column", name, type_, tuple(sorted(attrs.items())))


def _cols(text: str) -> tuple[str, ...]:
    return tuple(c.strip().strip("`").lower() for c in text.split(","))


def _element(element: str) -> tuple[Any, ...]:
    upper = _norm_expr(element)
    if m := re.fullmatch(r"(?:CONSTRAINT \w+ )?PRIMARY KEY\((.+)\)", upper):
        return ("primary", _cols(m.group(1)))
    if m := re.fullmatch(r"(UNIQUE )?(?:KEY|INDEX) (\w+)\((.+)\)", upper):
        return ("index", m.group(2).lower(), _cols(m.group(3)), bool(m.group(1)))
    if m := re.fullmatch(r"CONSTRAINT (\w+) UNIQUE\((.+)\)", upper):
        return ("index", m.group(1).lower(), _cols(m.group(2)), True)
    if m := re.fullmatch(r"CONSTRAINT (\w+) CHECK\((.+)\)", upper, re.S):
        return ("check", m.group(1).lower(), m.group(2))
    return _column(element)


def _options(text: str) -> tuple[Any, ...]:
    opts = {}
    for m in re.finditer(rf"(?i)(ENGINE|CHARSET|COLLATE|COMMENT)\s*=?\s*({_QUOTED}|\w+)", text):
        key = m.group(1).upper()
        value = m.group(2)
        opts[key] = value if value.startswith("'") else value.lower()
    return tuple(sorted(opts.items()))


def parse_ddl(sql: str) -> dict[str, dict[str, Any]]:
    """Tables of ``sql`` as comparable facts: columns (ordered), primary key, indexes, checks,
    options."""
    tables: dict[str, dict[str, Any]] = {}
    for stmt in _split_top(_strip_comments(sql), ";"):
        if m := re.match(r"(?is)CREATE TABLE `?(\w+)`?\s*\(", stmt):
            name = m.group(1).lower()
            body_start = m.end()
            depth, i = 1, body_start
            quote = False
            while depth:
                c = stmt[i]
                if quote:
                    quote = c != "'"
                elif c == "'":
                    quote = True
                elif c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                i += 1
            body, tail = stmt[body_start : i - 1], stmt[i:]
            facts: dict[str, Any] = {"columns": [], "indexes": set(), "checks": {}}
            for element in _split_top(body, ","):
                kind, *rest = _element(element)
                if kind == "column":
                    facts["columns"].append(tuple(rest))
                elif kind == "primary":
                    facts["primary"] = rest[0]
                elif kind == "index":
                    facts["indexes"].add(tuple(rest))
                else:
                    facts["checks"][rest[0]] = rest[1]
            facts["options"] = _options(tail)
            tables[name] = facts
        elif m := re.match(r"(?is)CREATE (UNIQUE )?INDEX (\w+) ON (\w+) \((.+)\)\s*$", stmt):
            index = (m.group(2).lower(), _cols(m.group(4)), bool(m.group(1)))
            tables[m.group(3).lower()]["indexes"].add(index)
    return tables


@pytest.mark.parametrize("chain", sorted(SEED_TABLES))
def test_mysql8_rendered_ddl_is_the_seed(chain: str) -> None:
    seed_file, names = SEED_TABLES[chain]
    rendered_sql = render_sql(chain, MYSQL8_URL)  # type: ignore[arg-type]
    assert "uca1400" not in rendered_sql  # the MariaDB mapping is not applied for MySQL 8
    seed = parse_ddl((SEEDS / seed_file).read_text(encoding="utf-8"))
    rendered = parse_ddl(rendered_sql)
    for name in names:
        assert name in rendered, f"{chain} migrations do not create {name}"
        mine, theirs = rendered[name], seed[name]
        assert len(theirs["columns"]) >= 6 and theirs["primary"]  # the parser really read it
        assert [c[0] for c in mine["columns"]] == [c[0] for c in theirs["columns"]], name
        for got, want in zip(mine["columns"], theirs["columns"], strict=True):
            assert got == want, f"{name}.{want[0]}"
        for key in ("primary", "indexes", "checks", "options"):
            assert mine[key] == theirs[key], f"{name}: {key} differ"


def test_mysql8_rendered_ddl_keeps_the_0900_collations() -> None:
    platform = parse_ddl(render_sql("platform", MYSQL8_URL))
    for name in SEED_TABLES["platform"][1]:
        assert ("COLLATE", "utf8mb4_0900_as_cs") in platform[name]["options"], name
    business = parse_ddl(render_sql("business", MYSQL8_URL))
    source_ref = next(c for c in business["sender_jobs"]["columns"] if c[0] == "source_ref")
    assert ("collate", "utf8mb4_0900_bin") in source_ref[2]


def test_the_comparison_sees_a_difference() -> None:
    """The parser is not blind: one changed default, index or check is a difference."""
    seed_sql = (SEEDS / "orbit_archive.sql").read_text(encoding="utf-8")
    base = parse_ddl(seed_sql)["orbit_archive_jobs"]
    for old, new in [
        ("DEFAULT 'PENDING'", "DEFAULT 'RUNNING'"),
        ("KEY ix_archive_job_list(namespace_id,created_at,id)", "KEY ix_archive_job_list(id)"),
        ("batch_size BETWEEN 1 AND 100 AND max_bytes", "batch_size BETWEEN 1 AND 99 AND max_bytes"),
        ("COLLATE=utf8mb4_0900_as_cs COMMENT='持久", "COLLATE=utf8mb4_bin COMMENT='持久"),
        ("attempts INT UNSIGNED NOT NULL", "attempts INT NOT NULL"),
    ]:
        assert old in seed_sql, old
        assert parse_ddl(seed_sql.replace(old, new))["orbit_archive_jobs"] != base, new
