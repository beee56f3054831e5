"""Column types with their dialect variants.

MySQL/MariaDB get the exact seed types (``BINARY(16)``, unsigned integers, ``DATETIME(6)``,
charset/collation per column); SQLite gets the closest storage class. Naive ``datetime`` values
are UTC everywhere in this project.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Integer, LargeBinary, String, Text
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.types import TypeEngine

MYSQL = ("mysql", "mariadb")


def _mysql(base: TypeEngine[Any], variant: TypeEngine[Any]) -> TypeEngine[Any]:
    return base.with_variant(variant, *MYSQL)


def Id16() -> TypeEngine[Any]:  # noqa: N802 - reads like a type in table definitions
    """``BINARY(16)`` id."""
    return _mysql(LargeBinary(16), mysql.BINARY(16))


def Digest32() -> TypeEngine[Any]:  # noqa: N802
    """``BINARY(32)`` raw SHA-256."""
    return _mysql(LargeBinary(32), mysql.BINARY(32))


def UBigInt() -> TypeEngine[Any]:  # noqa: N802
    return _mysql(BigInteger().with_variant(Integer(), "sqlite"), mysql.BIGINT(unsigned=True))


def UInt() -> TypeEngine[Any]:  # noqa: N802
    return _mysql(Integer(), mysql.INTEGER(unsigned=True))


def DateTime6() -> TypeEngine[Any]:  # noqa: N802
    """UTC ``DATETIME(6)``; the generic type would drop microseconds on MySQL."""
    return _mysql(DateTime(), mysql.DATETIME(fsp=6))


def Bool() -> TypeEngine[Any]:  # noqa: N802
    return Boolean(create_constraint=False)


def Str(length: int, charset: str | None = None, collation: str | None = None) -> TypeEngine[Any]:  # noqa: N802
    """``VARCHAR(n)``, optionally with its own MySQL charset/collation."""
    if charset is None and collation is None:
        return String(length)
    return _mysql(String(length), mysql.VARCHAR(length, charset=charset, collation=collation))


def Ascii(length: int, fixed: bool = False) -> TypeEngine[Any]:  # noqa: N802
    """``CHAR(n)``/``VARCHAR(n) CHARACTER SET ascii COLLATE ascii_bin``."""
    if fixed:
        return _mysql(String(length), mysql.CHAR(length, charset="ascii", collation="ascii_bin"))
    return _mysql(String(length), mysql.VARCHAR(length, charset="ascii", collation="ascii_bin"))


def Hex64() -> TypeEngine[Any]:  # noqa: N802
    """``CHAR(64)`` hex digest, in the table's charset."""
    return _mysql(String(64), mysql.CHAR(64))


def JsonText() -> TypeEngine[Any]:  # noqa: N802
    """``MEDIUMTEXT utf8mb4_bin``: JSON kept byte-exact as text (numbers stay exact)."""
    return _mysql(Text(), mysql.MEDIUMTEXT(charset="utf8mb4", collation="utf8mb4_bin"))


class utc_now_default(FunctionElement[Any]):  # noqa: N801 - SQL-function style name
    """Server default for "now, UTC, microseconds": ``CURRENT_TIMESTAMP(6)`` on MySQL."""

    inherit_cache = True
    name = "utc_now_default"


@compiles(utc_now_default, "mysql")
@compiles(utc_now_default, "mariadb")
def _utc_now_mysql(element: Any, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP(6)"


@compiles(utc_now_default)
def _utc_now_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now'))"
