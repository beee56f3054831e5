"""The table descriptions of ``orbit-archive/2`` manifests (SPEC §6, docs/archive-format.md):
describe a history table for the manifest, read the description back, rebuild the table from it
for any target dialect, and turn archived JSON values back into exact database values. Pure: no
I/O, no clock.

A column is described as ``{"name", "type", "nullable", "encoding"}`` plus ``"charset"`` and
``"collation"`` for text types. ``type`` is the MySQL 8 column type as the seed DDL writes it,
from a closed vocabulary (anything else is refused, at archive time and at read time):

==========================================  =============  =====================================
type                                        encoding       archived JSON value
==========================================  =============  =====================================
``BINARY(n)``, ``VARBINARY(n)``             ``hex``        lowercase hex of the bytes
``CHAR(n)``, ``VARCHAR(n)``, ``TINYTEXT``,  ``text``       the stored text (JSON columns too:
``TEXT``, ``MEDIUMTEXT``, ``LONGTEXT``                     numbers inside stay exact)
``TINYINT`` .. ``BIGINT`` [``UNSIGNED``]    ``integer``    a JSON integer
``DATETIME(6)``                             ``timestamp``  ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC)
==========================================  =============  =====================================

No history table has DECIMAL or FLOAT columns (exact decimals live inside JSON text); the
encoder refuses such values (``SOURCE_INVALID``), so they are not in the vocabulary.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeEngine

from orbit_tasks.archive.format.values import FORMAT_1, FormatError, parse_ts
from orbit_tasks.errors import InvalidInput
from orbit_tasks.platform.history import history_kind

MYSQL = ("mysql", "mariadb")
TEXT_BYTES = {"TINYTEXT": 255, "TEXT": 65_535, "MEDIUMTEXT": 16_777_215, "LONGTEXT": 4_294_967_295}
INT_BITS = {"TINYINT": 8, "SMALLINT": 16, "MEDIUMINT": 24, "INT": 32, "BIGINT": 64}
_SIZED = re.compile(r"^(BINARY|VARBINARY|CHAR|VARCHAR)\(([1-9][0-9]{0,4})\)$")
_INT = re.compile(r"^(TINYINT|SMALLINT|MEDIUMINT|INT|BIGINT)( UNSIGNED)?$")
_COMPILED = re.compile(
    r"^(?P<type>[A-Z0-9(), ]+?)"
    r"(?: CHARACTER SET (?P<charset>\w+))?(?: COLLATE (?P<collation>\w+))?$"
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_HEX = re.compile(r"^(?:[0-9a-f]{2})*$")
_SIZE_LIMIT = {"BINARY": 255, "CHAR": 255, "VARBINARY": 65_535, "VARCHAR": 65_535}
COLUMN_KEYS = frozenset({"name", "type", "nullable", "encoding"})
TEXT_KEYS = COLUMN_KEYS | {"charset", "collation"}


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: str
    nullable: bool
    encoding: str  # hex | text | integer | timestamp
    charset: str | None = None
    collation: str | None = None

    @property
    def base(self) -> str:
        return self.type.split("(")[0].split(" ")[0]

    @property
    def length(self) -> int | None:
        m = _SIZED.match(self.type)
        return int(m.group(2)) if m else None

    @property
    def unsigned(self) -> bool:
        return self.type.endswith(" UNSIGNED")

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "nullable": self.nullable,
            "encoding": self.encoding,
        }
        if self.encoding == "text":
            doc.update(charset=self.charset, collation=self.collation)
        return doc


@dataclass(frozen=True)
class TableSpec:
    name: str
    columns: tuple[ColumnSpec, ...]
    primary_key: tuple[str, ...]

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @functools.cached_property
    def key_positions(self) -> tuple[int, ...]:
        return tuple(self.names.index(k) for k in self.primary_key)

    @functools.cached_property
    def name_set(self) -> frozenset[str]:
        return frozenset(c.name for c in self.columns)

    @functools.cached_property
    def decoders(self) -> tuple[tuple[str, Decoder], ...]:
        return tuple((c.name, column_decoder(self.name, c)) for c in self.columns)


@dataclass(frozen=True)
class SourceSchema:
    """The root table, its settled column and its child tables (with their parent column).
    ``from_registry``: an ``orbit-archive/1`` manifest, described by today's table modules."""

    root: TableSpec
    settled_column: str
    children: tuple[tuple[TableSpec, str], ...]
    from_registry: bool = False

    @property
    def tables(self) -> tuple[TableSpec, ...]:
        return (self.root, *(spec for spec, _ in self.children))


# --------------------------------------------------------------------------- describe


def encoding_of(sql_type: str) -> str:
    """The JSON encoding of a vocabulary type; ``ValueError`` for a type outside it."""
    m = _SIZED.match(sql_type)
    if m:
        if int(m.group(2)) > _SIZE_LIMIT[m.group(1)]:
            raise ValueError(f"type {sql_type} is longer than {m.group(1)} allows")
        return "hex" if m.group(1) in ("BINARY", "VARBINARY") else "text"
    if sql_type in TEXT_BYTES:
        return "text"
    if _INT.match(sql_type):
        return "integer"
    if sql_type == "DATETIME(6)":
        return "timestamp"
    raise ValueError(f"column type {sql_type!r} is not in the orbit-archive/2 vocabulary")


def describe_column(column: Column[Any], table_charset: str, table_collation: str) -> ColumnSpec:
    compiled = str(column.type.compile(dialect=mysql.dialect()))
    m = _COMPILED.match(compiled)
    if not m:
        raise ValueError(f"{column.table.name}.{column.name}: cannot describe type {compiled!r}")
    sql_type = m.group("type").replace("INTEGER", "INT")
    try:
        encoding = encoding_of(sql_type)
    except ValueError as exc:
        raise ValueError(f"{column.table.name}.{column.name}: {exc}") from None
    if encoding != "text":
        return ColumnSpec(column.name, sql_type, bool(column.nullable), encoding)
    return ColumnSpec(
        column.name,
        sql_type,
        bool(column.nullable),
        encoding,
        m.group("charset") or table_charset,
        m.group("collation") or table_collation,
    )


def describe_table(table: Table) -> dict[str, Any]:
    """``{"columns": [...], "primary_key": [...]}`` of a table (MySQL 8 names, as the seed)."""
    options = table.dialect_options["mysql"]
    charset, collation = options.get("charset"), options.get("collate")
    if not charset or not collation:
        raise ValueError(f"table {table.name} has no mysql_charset/mysql_collate to describe")
    return {
        "columns": [describe_column(c, charset, collation).to_json() for c in table.columns],
        "primary_key": [c.name for c in table.primary_key.columns],
    }


# --------------------------------------------------------------------------- read back


def _need(cond: bool, reason: str) -> None:
    if not cond:
        raise FormatError(reason)


def parse_column(doc: Any, where: str) -> ColumnSpec:
    _need(isinstance(doc, dict), f"{where} is not an object")
    keys = TEXT_KEYS if doc.get("encoding") == "text" else COLUMN_KEYS
    _need(set(doc) == keys, f"{where} keys differ from orbit-archive/2")
    name, sql_type = doc["name"], doc["type"]
    _need(isinstance(name, str) and bool(_NAME.match(name)), f"{where} name bad")
    _need(isinstance(doc["nullable"], bool), f"{where} nullable bad")
    _need(isinstance(sql_type, str), f"{where} type bad")
    try:
        encoding = encoding_of(sql_type)
    except ValueError as exc:
        raise FormatError(f"{where}: {exc}") from None
    _need(doc["encoding"] == encoding, f"{where} encoding does not match its type")
    if encoding != "text":
        return ColumnSpec(name, sql_type, doc["nullable"], encoding)
    for key in ("charset", "collation"):
        _need(isinstance(doc[key], str) and bool(_NAME.match(doc[key])), f"{where} {key} bad")
    return ColumnSpec(name, sql_type, doc["nullable"], encoding, doc["charset"], doc["collation"])


def parse_table(name: Any, columns: Any, primary_key: Any, where: str) -> TableSpec:
    _need(isinstance(name, str) and bool(_NAME.match(name)), f"{where} table name bad")
    _need(isinstance(columns, list) and len(columns) > 0, f"{where} columns bad")
    cols = tuple(parse_column(c, f"{where} column {i}") for i, c in enumerate(columns))
    names = [c.name for c in cols]
    _need(len(set(names)) == len(names), f"{where} has a column twice")
    _need(
        isinstance(primary_key, list)
        and len(primary_key) > 0
        and len(set(primary_key)) == len(primary_key)
        and all(isinstance(k, str) and k in names for k in primary_key),
        f"{where} primary_key bad",
    )
    spec = TableSpec(name, cols, tuple(primary_key))
    for key in primary_key:
        _need(not spec.column(key).nullable, f"{where} primary key column {key} is nullable")
    return spec


def _id_column(spec: TableSpec, name: str, where: str) -> None:
    _need(name in spec.names, f"{where} has no column {name}")
    col = spec.column(name)
    _need(col.type == "BINARY(16)" and not col.nullable, f"{where} {name} is not BINARY(16)")


def parse_source(src: Any) -> SourceSchema:
    """Validate an ``orbit-archive/2`` manifest ``source`` (raises :class:`FormatError`)."""
    keys = {"table", "settled_column", "columns", "primary_key", "children"}
    _need(isinstance(src, dict) and set(src) == keys, "manifest source keys bad")
    root = parse_table(src["table"], src["columns"], src["primary_key"], "manifest source")
    for name in ("namespace_id", "id"):
        _id_column(root, name, "manifest source")
    settled = src["settled_column"]
    _need(isinstance(settled, str) and settled in root.names, "source settled_column bad")
    _need(root.column(settled).type == "DATETIME(6)", "source settled_column is not DATETIME(6)")
    _need(isinstance(src["children"], list), "manifest source.children bad")
    children = []
    for i, child in enumerate(src["children"]):
        where = f"manifest source.children[{i}]"
        ckeys = {"table", "parent_column", "columns", "primary_key"}
        _need(isinstance(child, dict) and set(child) == ckeys, f"{where} keys bad")
        spec = parse_table(child["table"], child["columns"], child["primary_key"], where)
        parent = child["parent_column"]
        _need(isinstance(parent, str), f"{where} parent_column bad")
        _id_column(spec, "namespace_id", where)
        _id_column(spec, parent, where)
        children.append((spec, parent))
    names = [root.name, *(spec.name for spec, _ in children)]
    _need(len(set(names)) == len(names), "manifest source names a table twice")
    return SourceSchema(root, settled, tuple(children))


def _registry_schema(kind_name: str, src: Mapping[str, Any]) -> SourceSchema:
    """An ``orbit-archive/1`` manifest names tables only: today's table modules describe them,
    and only if they are the same tables (each row's columns are checked when decoded)."""
    try:
        kind = history_kind(kind_name)
    except InvalidInput:
        raise FormatError(f"orbit-archive/1 kind {kind_name!r} is not a history kind") from None
    same = (
        src["table"] == kind.root.name
        and src["settled_column"] == kind.settled_column
        and [(c["table"], c["parent_column"]) for c in src["children"]]
        == [(c.table.name, c.parent_column) for c in kind.children]
    )
    _need(same, "orbit-archive/1 manifest names tables that today's history registry lacks")

    def spec(table: Table) -> TableSpec:
        d = describe_table(table)
        return parse_table(table.name, d["columns"], d["primary_key"], table.name)

    return SourceSchema(
        spec(kind.root),
        kind.settled_column,
        tuple((spec(c.table), c.parent_column) for c in kind.children),
        from_registry=True,
    )


def schema_of(manifest: Mapping[str, Any]) -> SourceSchema:
    """The source schema of a decoded manifest (format 1 or 2)."""
    if manifest["format"] == FORMAT_1:
        return _registry_schema(manifest["kind"], manifest["source"])
    return parse_source(manifest["source"])


# --------------------------------------------------------------------------- rebuild


def sqlalchemy_type(col: ColumnSpec) -> TypeEngine[Any]:
    """Exact MySQL/MariaDB type; SQLite gets the closest storage class (BLOB, TEXT, INTEGER,
    DATETIME text with microseconds)."""
    base, n = col.base, col.length
    cs = {"charset": col.charset, "collation": col.collation}
    if base == "BINARY":
        return LargeBinary(n).with_variant(mysql.BINARY(n), *MYSQL)
    if base == "VARBINARY":
        return LargeBinary(n).with_variant(mysql.VARBINARY(n), *MYSQL)
    if base in ("CHAR", "VARCHAR"):
        variant = mysql.CHAR(n, **cs) if base == "CHAR" else mysql.VARCHAR(n, **cs)
        return String(n).with_variant(variant, *MYSQL)
    if base in TEXT_BYTES:
        text_type = {
            "TINYTEXT": mysql.TINYTEXT,
            "TEXT": mysql.TEXT,
            "MEDIUMTEXT": mysql.MEDIUMTEXT,
            "LONGTEXT": mysql.LONGTEXT,
        }[base]
        return Text().with_variant(text_type(**cs), *MYSQL)
    if base in INT_BITS:
        int_type = {
            "TINYINT": mysql.TINYINT,
            "SMALLINT": mysql.SMALLINT,
            "MEDIUMINT": mysql.MEDIUMINT,
            "INT": mysql.INTEGER,
            "BIGINT": mysql.BIGINT,
        }[base]
        generic: TypeEngine[Any] = BigInteger() if base == "BIGINT" else Integer()
        return generic.with_variant(int_type(unsigned=col.unsigned), *MYSQL)
    return DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL)


def sqlalchemy_table(
    spec: TableSpec, metadata: MetaData, *, settled_column: str | None = None
) -> Table:
    """A table for ``spec`` with its primary key; a root (``settled_column`` given) also gets the
    archive's keyset index (namespace_id, settled, id), as the source tables have."""
    items: list[Any] = [
        Column(c.name, sqlalchemy_type(c), nullable=c.nullable) for c in spec.columns
    ]
    items.append(PrimaryKeyConstraint(*spec.primary_key))
    if settled_column is not None:
        items.append(Index(f"ix_{spec.name}_settled"[:64], "namespace_id", settled_column, "id"))
    return Table(spec.name, metadata, *items, mysql_engine="InnoDB", mysql_charset="utf8mb4")


# --------------------------------------------------------------------------- values


Decoder = Callable[[Any], Any]


def column_decoder(table: str, col: ColumnSpec) -> Decoder:
    """A function from an archived JSON value of ``col`` to the exact database value. It raises
    :class:`FormatError` naming the column and the rule, never the value (business content).
    Built once per column: a restore decodes every value of every row."""
    where = f"{table}.{col.name}"

    def bad(rule: str) -> FormatError:
        return FormatError(f"{where}: {rule}")

    def null() -> None:
        if not col.nullable:
            raise bad("null in a NOT NULL column")

    if col.encoding == "integer":
        bits = INT_BITS[col.base]
        lo, hi = (0, 2**bits - 1) if col.unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)

        def integer(value: Any) -> Any:
            if value is None:
                return null()
            if type(value) is not int:  # bool is not an integer here
                raise bad("not an integer")
            if not lo <= value <= hi:
                raise bad(f"integer out of range {lo}..{hi}")
            return value

        return integer
    if col.encoding == "hex":
        n, fixed = col.length or 0, col.base == "BINARY"

        def binary(value: Any) -> Any:
            if value is None:
                return null()
            if type(value) is not str or not _HEX.match(value):
                raise bad("not lowercase hex")
            data = bytes.fromhex(value)
            if (len(data) != n) if fixed else (len(data) > n):
                raise bad(f"{len(data)} bytes do not fit {col.type}")
            return data

        return binary
    if col.encoding == "timestamp":

        def timestamp(value: Any) -> Any:
            if value is None:
                return null()
            try:
                return parse_ts(value)
            except FormatError as exc:
                raise bad(exc.args[0]) from None

        return timestamp
    max_bytes = TEXT_BYTES.get(col.base)
    max_chars = col.length or 0
    ascii_only = col.charset == "ascii"
    bmp_only = col.charset in ("utf8", "utf8mb3")

    def text(value: Any) -> Any:
        if value is None:
            return null()
        if type(value) is not str:
            raise bad("not a JSON string")
        if max_bytes is not None:
            if len(value) * 4 > max_bytes and len(value.encode("utf-8")) > max_bytes:
                raise bad("text too long")
        elif len(value) > max_chars:
            raise bad(f"more characters than {col.type}")
        if ascii_only and not value.isascii():
            raise bad("non-ASCII text in an ascii column")
        if bmp_only and any(ord(ch) > 0xFFFF for ch in value):
            raise bad("4-byte UTF-8 in a utf8mb3 column")
        return value

    return text


def decode_value(table: str, col: ColumnSpec, value: Any) -> Any:
    """One archived JSON value as the exact database value (see :func:`column_decoder`)."""
    return column_decoder(table, col)(value)
