"""Column types, defaults and the DDL order of revision 0001 of both chains, frozen.

A copy of ``orbit_tasks/db/types.py`` as it was when p0001/b0001 were written (SPEC §12: a
revision never builds its tables from the live modules). Never edit this file: a later change of
a type is a new revision with its own copy. ``tests/integration/test_migrations_frozen.py`` proves
that the frozen tables still render exactly like the live table modules.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateIndex, CreateTable, ExecutableDDLElement
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.types import TypeEngine

from orbit_tasks.db import collation as _collation  # noqa: F401 - MariaDB names in CREATE TABLE

MYSQL = ("mysql", "mariadb")
PLATFORM_TABLE_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_0900_as_cs",
}
BUSINESS_TABLE_OPTIONS: dict[str, Any] = {"mysql_engine": "InnoDB"}


def _mysql(base: TypeEngine[Any], variant: TypeEngine[Any]) -> TypeEngine[Any]:
    return base.with_variant(variant, *MYSQL)


def id16() -> TypeEngine[Any]:
    return _mysql(LargeBinary(16), mysql.BINARY(16))


def digest32() -> TypeEngine[Any]:
    return _mysql(LargeBinary(32), mysql.BINARY(32))


def ubigint() -> TypeEngine[Any]:
    return _mysql(BigInteger().with_variant(Integer(), "sqlite"), mysql.BIGINT(unsigned=True))


def uint() -> TypeEngine[Any]:
    return _mysql(Integer(), mysql.INTEGER(unsigned=True))


def datetime6() -> TypeEngine[Any]:
    return _mysql(DateTime(), mysql.DATETIME(fsp=6))


def boolean() -> TypeEngine[Any]:
    return Boolean(create_constraint=False)


def varchar(length: int, charset: str | None = None, collation: str | None = None) -> Any:
    if charset is None and collation is None:
        return String(length)
    return _mysql(String(length), mysql.VARCHAR(length, charset=charset, collation=collation))


def ascii_str(length: int, fixed: bool = False) -> TypeEngine[Any]:
    if fixed:
        return _mysql(String(length), mysql.CHAR(length, charset="ascii", collation="ascii_bin"))
    return _mysql(String(length), mysql.VARCHAR(length, charset="ascii", collation="ascii_bin"))


def hex64() -> TypeEngine[Any]:
    return _mysql(String(64), mysql.CHAR(64))


def json_text() -> TypeEngine[Any]:
    return _mysql(Text(), mysql.MEDIUMTEXT(charset="utf8mb4", collation="utf8mb4_bin"))


class now6(FunctionElement[Any]):  # noqa: N801 - SQL-function style name
    """Server default "now, UTC, microseconds" of revision 0001."""

    inherit_cache = True
    name = "orbit_now6_0001"


@compiles(now6, "mysql")
@compiles(now6, "mariadb")
def _now6_mysql(element: Any, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP(6)"


@compiles(now6)
def _now6_other(element: Any, compiler: Any, **kw: Any) -> str:
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now'))"


def _on_mysql(ddl: Any, target: Any, bind: Any, **kw: Any) -> bool:
    return bool(kw["dialect"].name in MYSQL)


def mysql_only(ck: CheckConstraint) -> CheckConstraint:
    return ck.ddl_if(callable_=_on_mysql)  # type: ignore[arg-type]


def sqlite_only(ck: CheckConstraint) -> CheckConstraint:
    return ck.ddl_if(dialect="sqlite")


def create_statements(
    metadata: MetaData, only: Sequence[str] | None = None
) -> Iterator[ExecutableDDLElement]:
    """``CREATE TABLE`` and ``CREATE INDEX`` elements of revision 0001, in its order (tables by
    dependency, each followed by its indexes by name); ``only`` limits them to some tables.
    Elements, not ``Table.create``, so that online and offline (``--sql``) render the same."""
    for table in metadata.sorted_tables:
        if only is not None and table.name not in only:
            continue
        yield CreateTable(table)
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            yield CreateIndex(index)
