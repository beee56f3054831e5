"""What a table looks like, in one comparable form, and the differences between two tables (pure).

The same :class:`TableFacts` is built from a SQLAlchemy ``Table`` (what we expect) and from what a
server reports (``information_schema`` on MySQL/MariaDB, ``PRAGMA`` on SQLite; read in
``schema_check.py``). Server spellings are normalised here so that a table created by hand from
the seed DDL compares equal to the one our migrations create (docs/schema.md lists what is
compared):

* integer display widths are dropped (MariaDB reports ``int(10) unsigned``, MySQL 8 ``int
  unsigned``), except ``tinyint(1)``, which both keep for ``BOOLEAN``;
* MySQL 8 reports literal defaults unquoted and marks expression defaults ``DEFAULT_GENERATED``;
  MariaDB quotes literals and reports ``NULL`` for "no default" of a nullable column;
* default expressions and CHECK clauses compare by their parsed form (``sql_expr.comparable``);
* MySQL 8's ``utf8mb4_0900_*`` collations are expected as MariaDB's equivalents there (SPEC §2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.elements import TextClause

from orbit_tasks.db.collation import MARIADB_COLLATIONS
from orbit_tasks.db.sql_expr import comparable, constraints_of_create_table, unescape_mysql_clause

_INT_WIDTH = re.compile(r"^(tinyint|smallint|mediumint|int|bigint)\(\d+\)")
_CHARSET = re.compile(r"\s+character set\s+(\w+)")
_COLLATE = re.compile(r"\s+collate\s+(\w+)")
_STRING_TYPES = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set")
_NUMERIC_TYPES = (
    "tinyint",
    "smallint",
    "mediumint",
    "int",
    "bigint",
    "decimal",
    "float",
    "double",
    "bit",
    "year",
)


@dataclass(frozen=True)
class ColumnFacts:
    name: str
    type: str
    nullable: bool
    default: str | None  # normalised; None = no default
    charset: str | None = None
    collation: str | None = None
    comment: str = ""
    extra: str = ""  # "on update ...", "auto_increment", "virtual generated", ...


@dataclass(frozen=True)
class TableFacts:
    name: str
    columns: tuple[ColumnFacts, ...]
    indexes: dict[str, str]  # name ("PRIMARY" for the key) -> "unique (a, b)" / "(a, b)"
    checks: dict[str, str]  # name -> the clause as written or reported
    options: dict[str, str] = field(default_factory=dict)  # engine, collation, comment


# --- normalisation ---------------------------------------------------------------------------


def normalize_type(column_type: str) -> str:
    text = " ".join(column_type.lower().split())
    text = _COLLATE.sub("", _CHARSET.sub("", text))
    if text.startswith("tinyint(1)"):
        return text
    text = _INT_WIDTH.sub(r"\1", text)
    if text.startswith("integer"):
        text = "int" + text[len("integer") :]
    return "tinyint(1)" if text in ("bool", "boolean") else text


def normalize_default(value: str | None) -> str | None:
    """A default expression as written or reported; ``None`` when there is none (or NULL)."""
    if value is None:
        return None
    out = comparable(value.strip())
    return None if out == "null" else out


def mysql_reported_default(value: str | None, column_type: str, extra: str, mariadb: bool) -> Any:
    """MySQL 8 reports a literal default as its bare value (``PENDING``, ``''`` as empty);
    MariaDB as the SQL literal (``'PENDING'``). Bring MySQL's to MariaDB's form first."""
    if value is None or mariadb or "default_generated" in extra.lower():
        return normalize_default(value)
    if normalize_type(column_type).startswith(_NUMERIC_TYPES):
        return normalize_default(value)
    return normalize_default("'" + value.replace("'", "''") + "'")


def normalize_extra(extra: str) -> str:
    words = [w for w in extra.lower().split() if w != "default_generated"]
    return " ".join(words)


def mariadb_collation(name: str | None, mariadb: bool) -> str | None:
    if name is None or not mariadb:
        return name
    return MARIADB_COLLATIONS.get(name, name)


def describe_index(unique: bool, columns: list[str], kind: str = "btree") -> str:
    text = ("unique " if unique else "") + "(" + ", ".join(columns) + ")"
    return text if kind.lower() == "btree" else f"{text} using {kind.lower()}"


# --- expected facts from a SQLAlchemy table (MySQL / MariaDB) ----------------------------------


def expected_mysql_facts(table: Table, dialect: Dialect, schema_collation: str) -> TableFacts:
    """What ``information_schema`` should report for ``table`` on a server of ``dialect``
    (``schema_collation``: the database's default, for tables that name no collation)."""
    mariadb = bool(getattr(dialect, "is_mariadb", False))
    table_collation = mariadb_collation(table.kwargs.get("mysql_collate"), mariadb)
    columns = []
    for col in table.columns:
        compiled = str(col.type.compile(dialect=dialect)).lower()
        charset = collation = None
        type_ = normalize_type(compiled)
        if type_.startswith(_STRING_TYPES):
            m_cs, m_co = _CHARSET.search(compiled), _COLLATE.search(compiled)
            collation = mariadb_collation(m_co.group(1), mariadb) if m_co else None
            collation = collation or table_collation or schema_collation
            charset = m_cs.group(1) if m_cs else collation.split("_")[0]
        columns.append(
            ColumnFacts(
                name=col.name,
                type=type_,
                nullable=bool(col.nullable),
                default=normalize_default(_default_sql(col.server_default, dialect)),
                charset=charset,
                collation=collation,
                comment=col.comment or "",
            )
        )
    indexes = {"PRIMARY": describe_index(True, [c.name for c in table.primary_key.columns])}
    for constraint in table.constraints:
        if isinstance(constraint, UniqueConstraint):
            indexes[str(constraint.name)] = describe_index(
                True, [c.name for c in constraint.columns]
            )
    for index in table.indexes:
        indexes[str(index.name)] = describe_index(
            bool(index.unique), [c.name for c in index.columns]
        )
    ddl = str(CreateTable(table).compile(dialect=dialect))
    options = {"comment": table.comment or ""}
    if table.kwargs.get("mysql_engine"):
        options["engine"] = str(table.kwargs["mysql_engine"]).lower()
    if table_collation:
        options["collation"] = table_collation
    return TableFacts(
        table.name,
        tuple(columns),
        indexes,
        constraints_of_create_table(ddl).checks,
        options,
    )


def _default_sql(server_default: Any, dialect: Dialect) -> str | None:
    if server_default is None:
        return None
    arg = server_default.arg
    if isinstance(arg, str):
        return "'" + arg.replace("'", "''") + "'"
    if isinstance(arg, TextClause):
        return str(arg.text)
    return str(arg.compile(dialect=dialect))


# --- reported facts (MySQL / MariaDB information_schema rows) ----------------------------------


def mysql_reported_facts(
    name: str,
    table_row: Any,
    column_rows: list[Any],
    index_rows: list[Any],
    check_rows: list[Any],
    mariadb: bool,
) -> TableFacts:
    """Facts from the rows of ``information_schema`` TABLES (ENGINE, TABLE_COLLATION,
    TABLE_COMMENT), COLUMNS, STATISTICS and CHECK_CONSTRAINTS (name, clause[, enforced]) of one
    table; queries in ``schema_check.py``."""
    columns = tuple(
        ColumnFacts(
            name=r.COLUMN_NAME,
            type=normalize_type(r.COLUMN_TYPE),
            nullable=r.IS_NULLABLE == "YES",
            default=mysql_reported_default(r.COLUMN_DEFAULT, r.COLUMN_TYPE, r.EXTRA, mariadb),
            charset=r.CHARACTER_SET_NAME,
            collation=r.COLLATION_NAME,
            comment=r.COLUMN_COMMENT or "",
            extra=normalize_extra(r.EXTRA or ""),
        )
        for r in column_rows
    )
    grouped: dict[str, tuple[bool, str, list[str]]] = {}
    for r in index_rows:
        col = r.COLUMN_NAME or "(expression)"
        if r.SUB_PART:
            col += f"({r.SUB_PART})"
        if r.COLLATION == "D":
            col += " desc"
        grouped.setdefault(r.INDEX_NAME, (not r.NON_UNIQUE, r.INDEX_TYPE or "BTREE", []))[2].append(
            col
        )
    indexes = {k: describe_index(u, cols, kind) for k, (u, kind, cols) in grouped.items()}
    checks = {}
    for r in check_rows:
        clause = r.CHECK_CLAUSE if mariadb else unescape_mysql_clause(r.CHECK_CLAUSE)
        if getattr(r, "ENFORCED", "YES") == "NO":
            clause += " NOT ENFORCED"  # as MySQL writes it; never equal to an enforced one
        checks[r.CONSTRAINT_NAME] = clause
    options = {
        "comment": table_row.TABLE_COMMENT or "",
        "engine": (table_row.ENGINE or "").lower(),
        "collation": table_row.TABLE_COLLATION or "",
    }
    return TableFacts(name, columns, indexes, checks, options)


# --- differences ------------------------------------------------------------------------------

_COLUMN_FIELDS = ("type", "nullable", "default", "charset", "collation", "comment", "extra")


def _show(field_name: str, value: Any) -> str:
    if field_name == "nullable":
        return "NULL" if value else "NOT NULL"
    if value is None:
        return "none"
    if field_name in ("comment", "extra"):
        return repr(value)
    return str(value)


def table_differences(expected: TableFacts, actual: TableFacts) -> list[str]:
    """One line per difference of ``actual`` from ``expected`` (empty: they match)."""
    out: list[str] = []
    exp_cols = {c.name: c for c in expected.columns}
    act_cols = {c.name: c for c in actual.columns}
    out += [f"missing column {n}" for n in exp_cols if n not in act_cols]
    out += [f"unexpected column {n}" for n in act_cols if n not in exp_cols]
    for name, exp in exp_cols.items():
        act = act_cols.get(name)
        if act is None:
            continue
        for f in _COLUMN_FIELDS:
            want, got = getattr(exp, f), getattr(act, f)
            if want != got:
                out.append(f"column {name}: {f} {_show(f, got)}, expected {_show(f, want)}")
    common = [n for n in exp_cols if n in act_cols]
    if common != [n for n in act_cols if n in exp_cols]:
        out.append(
            "column order: "
            + ", ".join(n for n in act_cols if n in exp_cols)
            + "; expected "
            + ", ".join(common)
        )
    out += _named_differences("index", expected.indexes, actual.indexes, lambda v: v)
    out += _named_differences("CHECK", expected.checks, actual.checks, comparable)
    for key, want in expected.options.items():
        got = actual.options.get(key, "")
        if got != want:
            out.append(f"table {key} {got!r}, expected {want!r}")
    return out


def _named_differences(
    what: str, expected: dict[str, str], actual: dict[str, str], key: Any
) -> list[str]:
    out = [f"missing {what} {n} {expected[n]}" for n in expected if n not in actual]
    out += [f"unexpected {what} {n} {actual[n]}" for n in actual if n not in expected]
    for name, want in expected.items():
        got = actual.get(name)
        if got is not None and key(got) != key(want):
            out.append(f"{what} {name}: {got}, expected {want}")
    return out
