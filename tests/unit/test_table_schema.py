"""orbit-archive/2 table descriptions: describe, read back, rebuild for MySQL 8 / MariaDB /
SQLite (DDL rendered offline), decode values exactly; windows and their uncovered parts."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Float, MetaData, Numeric, Table, types
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.dialects.mysql.mariadb import MariaDBDialect
from sqlalchemy.schema import CreateTable

from orbit_tasks.archive.format import manifest as fm
from orbit_tasks.archive.format import tables as ts
from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.restore import rows as restore_rows
from orbit_tasks.archive.restore.run import Window, uncovered
from orbit_tasks.db.types import Bool, Id16
from orbit_tasks.errors import InvalidInput
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.archive_chain import manifest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "archive-format-1" / "volume"


def _schema(kind: str) -> ts.SourceSchema:
    return ts.schema_of(
        {"format": fv.FORMAT_2, "source": fm.source_descriptor(HISTORY_KINDS[kind])}
    )


def _ddl(table: Table, dialect: Any) -> str:
    return str(CreateTable(table).compile(dialect=dialect)).strip()


def _col_types(table: Table, dialect: Any) -> list[tuple[str, str, bool]]:
    return [(c.name, str(c.type.compile(dialect=dialect)), bool(c.nullable)) for c in table.columns]


@pytest.mark.parametrize("kind", list(HISTORY_KINDS))
def test_every_kind_is_described_and_rebuilt_with_its_exact_column_types(kind: str) -> None:
    hk = HISTORY_KINDS[kind]
    schema = _schema(kind)
    assert schema.settled_column == hk.settled_column and not schema.from_registry
    sources = [hk.root, *(c.table for c in hk.children)]
    assert [s.name for s in schema.tables] == [t.name for t in sources]
    assert [p for _, p in schema.children] == [c.parent_column for c in hk.children]
    for spec, original in zip(schema.tables, sources, strict=True):
        assert spec.names == tuple(c.name for c in original.columns)  # in order
        assert spec.primary_key == tuple(c.name for c in original.primary_key.columns)
        rebuilt = ts.sqlalchemy_table(spec, MetaData())
        # MySQL/MariaDB: the same type, charset and collation (the source's text columns take
        # the table default, the rebuilt ones name it); SQLite: the same storage classes.
        opts = original.dialect_options["mysql"]
        described = [ts.describe_column(c, opts["charset"], opts["collate"]) for c in rebuilt.c]
        assert described == [ts.describe_column(c, opts["charset"], opts["collate"])
                             for c in original.columns]  # fmt: skip
        assert _col_types(rebuilt, sqlite.dialect()) == _col_types(original, sqlite.dialect())


def test_mysql8_ddl_rendered_offline() -> None:
    """The CREATE TABLE a restore runs on MySQL 8: seed types and 0900 collations as written;
    the same description on MariaDB maps the collation (SPEC §2); SQLite gets storage classes."""
    schema = _schema("tasks")
    meta = MetaData()
    attempts = ts.sqlalchemy_table(schema.children[0][0], meta)
    assert _ddl(attempts, mysql.dialect()) == (
        "CREATE TABLE orbit_task_attempts (\n"
        "\tnamespace_id BINARY(16) NOT NULL, \n"
        "\ttask_id BINARY(16) NOT NULL, \n"
        "\tattempt_no INTEGER UNSIGNED NOT NULL, \n"
        "\tstate VARCHAR(16) CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_as_cs NOT NULL, \n"
        "\tworker VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_as_cs NOT NULL, \n"
        "\terror_code VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_as_cs NOT NULL, \n"
        "\tstarted_at DATETIME(6) NOT NULL, \n"
        "\tfinished_at DATETIME(6), \n"
        "\tPRIMARY KEY (namespace_id, task_id, attempt_no)\n"
        ")ENGINE=InnoDB CHARSET=utf8mb4"
    )
    root = ts.sqlalchemy_table(schema.root, meta, settled_column="finished_at")
    ddl = _ddl(root, mysql.dialect())
    assert "\tid BINARY(16) NOT NULL, \n" in ddl
    assert "\tidempotency_key VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin, \n" in ddl
    assert "\trequest_json MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL" in ddl
    assert "PRIMARY KEY (namespace_id, id)" in ddl
    mariadb = _ddl(attempts, MariaDBDialect())
    assert "utf8mb4_uca1400_as_cs" in mariadb and "0900" not in mariadb
    lite = _ddl(attempts, sqlite.dialect())
    assert "namespace_id BLOB NOT NULL" in lite and "started_at DATETIME NOT NULL" in lite
    assert "PRIMARY KEY (namespace_id, task_id, attempt_no)" in lite


def test_description_in_the_manifest() -> None:
    doc = json.loads(manifest())
    cols = {c["name"]: c for c in doc["source"]["columns"]}
    assert list(cols)[:3] == ["namespace_id", "id", "queue_id"]
    assert cols["id"] == {"name": "id", "type": "BINARY(16)", "nullable": False, "encoding": "hex"}
    assert cols["request_json"] == {
        "name": "request_json", "type": "MEDIUMTEXT", "nullable": False, "encoding": "text",
        "charset": "utf8mb4", "collation": "utf8mb4_bin",
    }  # fmt: skip
    assert cols["idempotency_key"]["charset"] == "ascii"
    assert cols["attempts"]["type"] == "INT UNSIGNED"
    assert cols["finished_at"] == {
        "name": "finished_at", "type": "DATETIME(6)", "nullable": True, "encoding": "timestamp",
    }  # fmt: skip
    assert doc["source"]["primary_key"] == ["namespace_id", "id"]
    child = doc["source"]["children"][0]
    assert child["primary_key"] == ["namespace_id", "task_id", "attempt_no"]


def test_types_outside_the_vocabulary_are_refused_when_describing() -> None:
    for typ in (Numeric(10, 2), Float(), Bool()):
        t = Table("t", MetaData(), Column("id", Id16()), Column("x", typ),
                  mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin")  # fmt: skip
        with pytest.raises(ValueError, match="vocabulary"):
            ts.describe_table(t)
    bare = Table("t", MetaData(), Column("id", Id16()))
    with pytest.raises(ValueError, match="mysql_charset"):
        ts.describe_table(bare)


def _bad_source(mutate: Any) -> None:
    doc = json.loads(manifest())
    mutate(doc["source"])
    with pytest.raises(fv.FormatError):
        fm.decode_manifest(fv.canonical_json(doc))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.pop("columns"),
        lambda s: s.update(primary_key=[]),
        lambda s: s.update(primary_key=["nope"]),
        lambda s: s.update(settled_column="state"),  # not DATETIME(6)
        lambda s: s.update(settled_column="missing"),
        lambda s: s["columns"][1].update(type="CHAR(16)"),  # id must be BINARY(16)
        lambda s: s["columns"][3].update(type="DECIMAL(10,2)"),
        lambda s: s["columns"][3].update(encoding="hex"),  # encoding does not fit the type
        lambda s: s["columns"][3].pop("charset"),
        lambda s: s["columns"][2].update(charset="utf8mb4"),  # binary with a charset
        lambda s: s["columns"][0].update(nullable=True),  # a nullable primary key column
        lambda s: s["columns"].append(dict(s["columns"][3])),  # a column twice
        lambda s: s["columns"][3].update(type="VARCHAR(70000)"),
        lambda s: s["columns"][3].update(name="bad name"),
        lambda s: s["children"][0].update(parent_column="workflow_id"),
        lambda s: s["children"][0].pop("primary_key"),
        lambda s: s["children"][0].update(table="orbit_tasks"),  # a table twice
    ],
)
def test_decode_manifest_refuses_bad_descriptions(mutate: Any) -> None:
    _bad_source(mutate)


def test_format1_manifests_are_described_by_todays_tables() -> None:
    data = next(FIXTURE.glob("*/*/00000000-*.json")).read_bytes()
    doc = fm.decode_manifest(data)
    assert doc["format"] == fv.FORMAT_1
    schema = ts.schema_of(doc)
    assert schema.from_registry and schema.tables == _schema("tasks").tables
    renamed = {**doc, "source": {**doc["source"], "table": "orbit_tasks_v0"}}
    with pytest.raises(fv.FormatError, match="registry"):
        ts.schema_of(renamed)
    with pytest.raises(fv.FormatError, match="not a history kind"):
        ts.schema_of({**doc, "kind": "gone"})


def _col(sql_type: str, nullable: bool = False, charset: str | None = None) -> ts.ColumnSpec:
    enc = ts.encoding_of(sql_type)
    if enc == "text":
        return ts.ColumnSpec("c", sql_type, nullable, enc, charset or "utf8mb4", "utf8mb4_bin")
    return ts.ColumnSpec("c", sql_type, nullable, enc)


def test_decode_value_is_exact_and_strict() -> None:
    dv = ts.decode_value
    assert dv("t", _col("BINARY(16)"), "00" * 15 + "ff") == b"\x00" * 15 + b"\xff"
    assert dv("t", _col("DATETIME(6)"), "2026-03-01T00:00:00.000001Z") == datetime(
        2026, 3, 1, 0, 0, 0, 1
    )
    text = '{"a":1.10,"b":12345678901234567890.000,"s":"😀"}'
    assert dv("t", _col("MEDIUMTEXT"), text) == text
    assert dv("t", _col("VARCHAR(4)"), "😀😀😀😀") == "😀😀😀😀"  # characters, not bytes
    assert dv("t", _col("INT UNSIGNED"), 4294967295) == 4294967295
    assert dv("t", _col("BIGINT"), -(2**63)) == -(2**63)
    assert dv("t", _col("DATETIME(6)", nullable=True), None) is None
    bad = [
        (_col("BINARY(16)"), "00" * 15),  # short
        (_col("BINARY(16)"), "AB" * 16),  # upper case
        (_col("BINARY(16)"), 5),
        (_col("VARBINARY(2)"), "000000"),
        (_col("VARCHAR(3)"), "abcd"),
        (_col("VARCHAR(8)", charset="ascii"), "café"),
        (_col("VARCHAR(8)", charset="utf8mb3"), "😀"),
        (_col("TINYTEXT"), "é" * 200),  # 400 bytes
        (_col("INT UNSIGNED"), -1),
        (_col("INT UNSIGNED"), 2**32),
        (_col("TINYINT"), 128),
        (_col("INT"), True),
        (_col("INT"), "1"),
        (_col("DATETIME(6)"), "2026-03-01 00:00:00"),
        (_col("VARCHAR(8)"), None),  # NOT NULL
    ]
    for col, value in bad:
        with pytest.raises(fv.FormatError) as err:
            dv("orbit_x", col, value)
        assert "orbit_x.c" in str(err.value)
        if isinstance(value, str) and len(value) > 3:
            assert value not in str(err.value)  # the message never carries the content


def test_decode_row_needs_exactly_the_described_columns() -> None:
    spec = _schema("events").root
    row = {c.name: None for c in spec.columns}
    with pytest.raises(fv.FormatError, match="missing \\['subject_id'\\], extra \\['x'\\]"):
        restore_rows.decode_row(
            spec, {**{k: v for k, v in row.items() if k != "subject_id"}, "x": 1}
        )


def test_differing_columns_and_keys() -> None:
    spec = _schema("events").root
    row = {
        "namespace_id": b"\x01" * 16, "id": b"\x02" * 16, "type": "t", "subject_id": None,
        "payload_json": "{}", "created_at": datetime(2026, 3, 1, 0, 0, 0, 5),
    }  # fmt: skip
    values = [row[n] for n in spec.names]
    assert restore_rows.differing_columns(spec, row, values) == []
    as_view = [memoryview(v) if isinstance(v, bytes) else v for v in values]
    assert restore_rows.differing_columns(spec, row, as_view) == []  # drivers that return buffers
    later = {**row, "created_at": datetime(2026, 3, 1, 0, 0, 0, 6), "payload_json": "{ }"}
    changed = [later[n] for n in spec.names]
    assert restore_rows.differing_columns(spec, row, changed) == ["payload_json", "created_at"]
    text_id = [v.hex() if isinstance(v, bytes) else v for v in values]  # same text, other type
    assert restore_rows.differing_columns(spec, row, text_id) == ["namespace_id", "id"]
    assert restore_rows.primary_key_at(spec, as_view) == (b"\x01" * 16, b"\x02" * 16)
    assert restore_rows.key_json(spec, row) == {"namespace_id": "01" * 16, "id": "02" * 16}


def test_check_columns_of_an_existing_target_table() -> None:
    spec = _schema("events").root
    good = [{"name": c.name, "type": ts.sqlalchemy_type(c).with_variant(types.NullType(), "x"),
             "nullable": c.nullable, "default": None} for c in spec.columns]  # fmt: skip
    good = [{**g, "type": _generic(c)} for g, c in zip(good, spec.columns, strict=True)]
    assert restore_rows.check_columns(spec, good) == []
    problems = restore_rows.check_columns(
        spec,
        [g for g in good if g["name"] != "type"]
        + [{"name": "extra", "type": types.Integer(), "nullable": False, "default": None}],
    )
    assert problems == [
        "column type is missing",
        "extra column extra is NOT NULL without a default",
    ]
    short = [{**g, "type": mysql.DATETIME(fsp=0)} if g["name"] == "created_at" else g for g in good]
    assert (
        "created_at is DATETIME without microseconds" in restore_rows.check_columns(spec, short)[0]
    )
    text_id = [{**g, "type": types.String(32)} if g["name"] == "id" else g for g in good]
    assert "column id is VARCHAR(32) (archive: BINARY(16))" in restore_rows.check_columns(
        spec, text_id
    )


def _generic(col: ts.ColumnSpec) -> Any:
    return {
        "hex": mysql.BINARY(16),
        "text": mysql.VARCHAR(1000),
        "integer": mysql.INTEGER(),
        "timestamp": mysql.DATETIME(fsp=6),
    }[col.encoding]


T = datetime(2026, 3, 1)
D = timedelta(days=1)


def test_window_meets_ranges() -> None:
    march = Window(T, T + 31 * D)
    assert march.meets(ArchiveRange(None, T + D))  # from the beginning into March
    assert march.meets(ArchiveRange(T - 5 * D, T + 2 * D))
    assert not march.meets(ArchiveRange(None, T))  # ends where March starts
    assert not march.meets(ArchiveRange(T + 31 * D, T + 40 * D))  # starts where March ends
    assert not march.meets(ArchiveRange(T + D, T + D))  # empty range
    assert Window().meets(ArchiveRange(None, T))
    assert march.contains(T) and not march.contains(T + 31 * D)
    with pytest.raises(InvalidInput, match="must be before"):
        Window(T, T)


def test_uncovered_parts_of_a_window() -> None:
    march = Window(T, T + 31 * D)
    r = ArchiveRange
    assert uncovered(march, [r(None, T + 10 * D), r(T + 10 * D, T + 40 * D)]) == []
    assert uncovered(march, [r(None, T + 10 * D)]) == [(T + 10 * D, T + 31 * D)]
    assert uncovered(march, [r(None, T + 5 * D), r(T + 7 * D, T + 9 * D)]) == [
        (T + 5 * D, T + 7 * D),
        (T + 9 * D, T + 31 * D),
    ]
    assert uncovered(march, [r(T + 2 * D, T + 40 * D)]) == [(T, T + 2 * D)]
    assert uncovered(march, []) == [(T, T + 31 * D)]
    assert uncovered(Window(None, T), [r(T - D, T)]) == [(None, T - D)]
    assert uncovered(Window(T, None), [r(None, T + D)]) == []  # no end: nothing missing yet
