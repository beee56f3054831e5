"""The two encoders of a canonical line, side by side (issue 19 item 3).

The hot path writes lines with ``orjson``; the format's definition is the standard library's
``json`` with sorted keys, no spaces and no ASCII escaping (``canonical_json``, SPEC §6). Both
must give the same bytes for every value a history row can hold. The corpus below draws from
every value class: 4-byte UTF-8, every control character, U+2028/2029, quotes and backslashes,
the integer boundaries around 64 bits and far beyond, NULLs, booleans, empty strings; lines with
children as on every history kind (the generator's rows are compared in test_batch_lines.py).
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.format.lines import LineEncoder, presorted_line

CONTROL = [chr(c) for c in range(0x20)] + ["\x7f", "\x80", "\x9f"]
SPECIAL = ["\u2028", "\u2029", '"', "\\", "/", "\ufeff", "\ufffe", "\uffff", "\ud7ff", "\ue000"]
WIDE = ["é", "ß", "中", "😀", "𝄞", "🏳️‍🌈", "\U0010ffff", "\U00010000"]
INT_EDGES = [
    0, 1, -1, 2**31, -(2**31), 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1,
    2**64 - 1, 2**64, -(2**64), 10**30, -(10**30), int("9" * 400),
]  # fmt: skip


def _text(rng: random.Random) -> str:
    pool = CONTROL + SPECIAL + WIDE + list("abcXYZ 019_-.:{}[],")
    return "".join(rng.choice(pool) for _ in range(rng.randrange(0, 12)))


def _value(rng: random.Random) -> Any:
    pick = rng.randrange(6)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice(INT_EDGES) + rng.choice([0, 0, 1, -1])
    if pick == 3:
        return rng.randrange(-(2**70), 2**70)
    if pick == 4:
        return ""
    return _text(rng)


def _canonical(obj: Any) -> bytes:
    return fv.canonical_json(obj)


@pytest.mark.parametrize("seed", range(40))
def test_orjson_lines_equal_the_standard_encoder_on_a_corpus(seed: int) -> None:
    rng = random.Random(seed)
    columns = sorted({f"c{rng.randrange(99)}" for _ in range(8)} | {"id", "settled_at"})
    rng.shuffle(columns)  # row tuples in any column order
    kids = [("a_child", ["id", "parent", "v"]), ("b_child", ["id", "w", "x", "y"])]
    enc = LineEncoder(columns, "settled_at", kids)
    for _ in range(150):
        root = tuple(_value(rng) for _ in columns)
        children = {
            name: [tuple(_value(rng) for _ in cols) for _ in range(rng.randrange(3))]
            for name, cols in kids
        }
        line = enc.line(root, children)
        expected = _canonical(
            {
                "children": {
                    n: [dict(zip(c, r, strict=True)) for r in children[n]] for n, c in kids
                },
                "root": dict(zip(columns, root, strict=True)),
            }
        )
        assert line == expected


@pytest.mark.parametrize("value", CONTROL + SPECIAL + WIDE + INT_EDGES + [None, True, False, ""])
def test_every_edge_value_alone(value: Any) -> None:
    assert presorted_line({"v": value, "w": [value, {"x": value}]}) == _canonical(
        {"v": value, "w": [value, {"x": value}]}
    )


def test_orjson_itself_still_agrees_where_it_encodes() -> None:
    """The fast path is orjson's own output (not a fallback) for every value it accepts: a
    change of orjson's spelling shows here, not only as a slower fallback."""
    for value in CONTROL + SPECIAL + WIDE + [2**63 - 1, -(2**63), 2**64 - 1, None, True, ""]:
        obj = {"v": value}
        assert orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE) == _canonical(obj)
    for big in (2**64, -(2**63) - 1, 10**30):
        with pytest.raises(orjson.JSONEncodeError):
            orjson.dumps({"v": big})
        assert presorted_line({"v": big}) == _canonical({"v": big})


def test_a_lone_surrogate_is_still_refused_by_the_fallback() -> None:
    with pytest.raises(UnicodeEncodeError):
        presorted_line({"v": "a\ud800"})
