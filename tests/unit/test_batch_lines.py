"""The hot path's line encoder writes exactly the canonical lines of ``build_batch`` (SPEC §6)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from orbit_tasks.archive.format import batch as ff
from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.format.lines import LineEncoder
from orbit_tasks.archive.store.source import line_encoder
from orbit_tasks.dev import generator
from orbit_tasks.platform.history import HISTORY_KINDS

JOB = bytes.fromhex("0190f0aa000070008000000000000002")
NOW = datetime(2026, 3, 1, 12, 0, 0, 123456)


def _tuples(kind: str, seed: int, server_times: bool) -> list[tuple[Any, dict[str, list[Any]]]]:
    """Generator rows of ``kind`` as (root tuple, {child table: [row tuples]}), settled only;
    with ``server_times`` datetimes spelled as MariaDB's DATE_FORMAT returns them."""
    hk = HISTORY_KINDS[kind]
    spec = generator.make_spec(kind, 40, days=3, settled_fraction=1.0)
    chunk = next(generator.generate(spec, bytes(16), [bytes(16)], random.Random(seed), NOW))

    def tup(table: Any, row: dict[str, Any]) -> tuple[Any, ...]:
        values = [row.get(c.name) for c in table.columns]
        if server_times:  # DATE_FORMAT(...) and LOWER(HEX(...)) on MySQL/MariaDB
            values = [
                fv.format_ts(v) if isinstance(v, datetime)
                else v.hex() if isinstance(v, bytes) else v
                for v in values
            ]  # fmt: skip
        return tuple(values)

    out = []
    for root in chunk.roots:
        kids: dict[str, list[Any]] = {}
        for child in hk.children:
            rows = [r for r in chunk.children if r[child.parent_column] == root["id"]]
            kids[child.table.name] = [tup(child.table, r) for r in rows]
        out.append((root, tup(hk.root, root), kids))
    out.sort(key=lambda item: (item[0][hk.settled_column], item[0]["id"]))
    return [(t, k) for _, t, k in out]


@pytest.mark.parametrize("server_times", [False, True], ids=["datetimes", "server-formatted"])
@pytest.mark.parametrize("kind", list(HISTORY_KINDS))
def test_lines_and_files_equal_build_batch_on_every_kind(kind: str, server_times: bool) -> None:
    hk = HISTORY_KINDS[kind]
    enc = line_encoder(kind)
    rows = _tuples(kind, seed=len(kind), server_times=server_times)
    names = list(hk.root.columns.keys())
    records = []
    for root, kids in rows:
        root_dict = dict(zip(names, root, strict=True))
        if server_times:  # the generic path gets real datetimes and bytes
            root_dict = {k: _db_value(hk.root.c[k], v) for k, v in root_dict.items()}
        children = {}
        for child in hk.children:
            cols = list(child.table.columns.keys())
            children[child.table.name] = [
                {
                    c: _db_value(child.table.c[c], v) if server_times else v
                    for c, v in zip(cols, r, strict=True)
                }
                for r in kids[child.table.name]
            ]
        records.append(ff.RootRecord(root_dict, children))
    expected = ff.build_batch(
        job_id=JOB, seq=3, prev_sha256="1" * 64, records=records,
        settled_column=hk.settled_column, final=False,
    )  # fmt: skip
    lines = [enc.line(root, kids) for root, kids in rows]
    keys = [enc.key(root) for root, _ in rows]
    built = ff.build_batch_file(
        job_id=JOB, seq=3, prev_sha256="1" * 64, lines=lines, first=keys[0], last=keys[-1],
        final=False,
    )  # fmt: skip
    assert built == expected
    decoded = ff.decode_batch(built, settled_column=hk.settled_column)
    assert [tuple(k) for k in (decoded.header["first"], decoded.header["last"])] == [
        keys[0],
        keys[-1],
    ]


def _db_value(column: Any, value: Any) -> Any:
    """The value the database holds for one a server spelled (test of the equivalence)."""
    from sqlalchemy import DateTime, LargeBinary

    if value is None:
        return None
    if isinstance(column.type, DateTime):
        return fv.parse_ts(value)
    if isinstance(column.type, LargeBinary):
        return bytes.fromhex(value)
    return value


COLS = ["id", "z", "a", "t", "n", "b", "flag", "created_at"]


def test_every_value_type_and_escape_is_canonical() -> None:
    enc = LineEncoder(COLS, "created_at")
    texts = [
        'quote " backslash \\ slash /',
        "line\nbreak\ttab\r\x00\x1f\x7f",
        "\u2028\u2029 separators",
        "emoji \U0001f600 \U0001d11e cafe\u0301",
        "",
    ]
    for i, text in enumerate(texts):
        row = (
            bytes([i]) * 16, text, None, NOW + timedelta(microseconds=i), 2**64 - 1 - i,
            b"\x00\xff", i % 2 == 0, NOW,
        )  # fmt: skip
        generic = fv.canonical_json(
            {
                "children": {},
                "root": {k: fv.encode_value(v) for k, v in zip(COLS, row, strict=True)},
            }
        )
        assert enc.line(row, {}) == generic


def test_values_that_cannot_be_encoded_name_the_column_not_the_value() -> None:
    enc = LineEncoder(["id", "amount", "memo", "created_at"], "created_at", [("kids", ["id", "x"])])
    good = (bytes(16), 1, "ok", NOW)
    with pytest.raises(fv.SourceInvalid, match=r"^root\.amount") as err:
        enc.line((bytes(16), 0.1, "ok", NOW), {})
    assert "0.1" not in str(err.value)
    with pytest.raises(fv.SourceInvalid, match=r"^root\.amount"):
        enc.line((bytes(16), Decimal("1.10"), "ok", NOW), {})
    with pytest.raises(fv.SourceInvalid, match=r"^root\.memo.*surrogate"):
        enc.line((bytes(16), 1, "\ud800", NOW), {})
    with pytest.raises(fv.SourceInvalid, match=r"^kids\.x.*surrogate"):
        enc.line(good, {"kids": [(bytes(16), "\udc80")]})
    with pytest.raises(fv.SourceInvalid, match="unsettled"):
        enc.key((bytes(16), 1, "ok", None))
    with pytest.raises(fv.SourceInvalid, match="unsettled"):
        enc.key((bytes(16), 1, "ok", "2026-01-01 00:00:00"))  # not the archive spelling
    with pytest.raises(fv.SourceInvalid, match="16 bytes"):
        enc.key((b"\x01", 1, "ok", NOW))
    assert enc.key(good) == (fv.format_ts(NOW), bytes(16).hex())
    assert enc.key((bytes(16), 1, "ok", fv.format_ts(NOW))) == enc.key(good)


def test_batch_header_reads_only_the_first_line() -> None:
    enc = LineEncoder(["id", "blob", "created_at"], "created_at")
    rnd = random.Random(5)
    rows = [(bytes([i]) * 16, rnd.randbytes(40_000).hex(), NOW) for i in range(1, 4)]
    lines = [enc.line(r, {}) for r in rows]
    data = ff.build_batch_file(
        job_id=JOB, seq=7, prev_sha256="2" * 64, lines=lines, first=enc.key(rows[0]),
        last=enc.key(rows[-1]), final=True,
    )  # fmt: skip
    header = ff.batch_header(data)
    assert header == ff.decode_batch(data).header and header["prev_sha256"] == "2" * 64
    assert ff.batch_header(data[:2048])["seq"] == 7  # the header is in the first bytes
    for bad in (b"", b"not gzip at all", data[:12]):
        with pytest.raises(fv.FormatError):
            ff.batch_header(bad)
