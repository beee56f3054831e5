"""Batch lines of ``orbit-archive/1`` straight from database row tuples (SPEC §6). Pure.

:func:`fileformat.build_batch` encodes ``RootRecord`` dicts value by value; the archive's hot
path reads rows as tuples and encodes them here instead. A line is still exactly
``canonical_json({"children": {...}, "root": {...}})`` -- the same C encoder and settings, with
every object built in sorted key order so the encoder need not sort -- so a file has one valid
spelling whichever path built it (the unit tests compare both on every history kind, and every
decoder re-checks canonical form). The line is written by ``orjson`` (C, UTF-8 out, about twice as
fast as the standard encoder here, docs/archive-format.md "Encoders"); for the few lines it
refuses (integers beyond 64 bits, lone surrogates) the standard encoder writes or refuses the
line exactly as before, and a unit test runs both encoders side by side on a corpus of every value
class (``tests/unit/test_line_encoders.py``). What is saved is the per-value work in Python: on
MySQL/MariaDB the server already spells binary columns as lowercase hex and datetimes as
``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (:mod:`orbit_tasks.archive.store.source`), so a row holds only
``str``, ``int`` and ``None`` and goes to the C encoder as it is. Rows with other values (SQLite's
``bytes`` and ``datetime``) are converted value by value by the format's rules
(:func:`fileformat.encode_value`), which raise :class:`SourceInvalid` for values that cannot be
encoded exactly (floats, decimals...). Errors name ``table.column``, never the value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any

import orjson

from orbit_tasks.archive.format.values import SourceInvalid, encode_value, format_ts

Key = tuple[str, str]  # (settled as YYYY-MM-DDTHH:MM:SS.ffffffZ, id hex): a root's order key
Rows = Sequence[Sequence[Any]]

_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$", re.ASCII)
_HEX32 = re.compile(r"^[0-9a-f]{32}$", re.ASCII)
_JSON_NATIVE = frozenset({str, int, type(None)})  # encoded by canonical_json as they are
# canonical_json's encoder without the key sort, for objects whose keys are inserted sorted
_PRESORTED = json.JSONEncoder(
    sort_keys=False, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_ORJSON_LINE = orjson.OPT_APPEND_NEWLINE  # insertion order kept: keys are inserted sorted


def presorted_line(obj: dict[str, Any]) -> bytes:
    """``obj`` (every object's keys inserted in sorted order) as one canonical line: orjson's
    bytes, or the standard encoder's where orjson refuses a value (an integer beyond 64 bits, a
    lone surrogate -- the standard encoder then raises ``UnicodeEncodeError``)."""
    try:
        return orjson.dumps(obj, option=_ORJSON_LINE)
    except orjson.JSONEncodeError:
        return _PRESORTED.encode(obj).encode("utf-8") + b"\n"


class _Table:
    """One table's column names (in the order of its row tuples), and how to pick its values
    in sorted-name order: objects are built with their keys already sorted, so the encoder
    does not sort them again (:data:`_PRESORTED`)."""

    def __init__(self, name: str, columns: Sequence[str]) -> None:
        self.name = str(name)  # plain str: orjson refuses str subclasses as keys
        self.columns = tuple(str(c) for c in columns)
        order = sorted(range(len(columns)), key=lambda i: self.columns[i])
        self.sorted_names = tuple(self.columns[i] for i in order)
        self._pick = itemgetter(*order) if len(order) > 1 else lambda row: (row[order[0]],)

    def object(self, row: Sequence[Any]) -> dict[str, Any]:
        values = self._pick(row)
        if _JSON_NATIVE.issuperset(map(type, values)):
            return dict(zip(self.sorted_names, values, strict=True))
        try:
            return dict(zip(self.sorted_names, map(encode_value, values), strict=True))
        except SourceInvalid:
            raise self.first_failure(row) or SourceInvalid(f"{self.name}: bad value") from None

    def first_failure(self, row: Sequence[Any]) -> SourceInvalid | None:
        """The error of the first column that cannot be encoded, named ``table.column``."""
        for column, value in zip(self.columns, row, strict=True):
            try:
                encode_value(value)
            except SourceInvalid as exc:
                return SourceInvalid(f"{self.name}.{column}: {exc}")
        return None


class LineEncoder:
    """Encodes roots of one history kind: ``root_columns`` in the order of the row tuples,
    ``children`` = (table name, its columns) in any order."""

    def __init__(
        self,
        root_columns: Sequence[str],
        settled_column: str,
        children: Sequence[tuple[str, Sequence[str]]] = (),
    ) -> None:
        self._root = _Table("root", root_columns)
        self._settled = list(root_columns).index(settled_column)
        self._id = list(root_columns).index("id")
        self._children = sorted((_Table(n, cols) for n, cols in children), key=lambda t: t.name)

    def root_id(self, root: Sequence[Any]) -> Any:
        """The root's id as its children's parent column holds it (hex or bytes)."""
        return root[self._id]

    def key(self, root: Sequence[Any]) -> Key:
        """The root's (settled, id) key as the header's ``first``/``last`` spell it."""
        settled, rid = root[self._settled], root[self._id]
        if type(settled) is str and _TS.match(settled):
            ts = settled
        elif isinstance(settled, datetime):
            ts = format_ts(settled)
        else:
            raise SourceInvalid("root settled column is not a datetime (unsettled root?)")
        if type(rid) is str and _HEX32.match(rid):
            return ts, rid
        if type(rid) is not bytes or len(rid) != 16:
            raise SourceInvalid("root id is not 16 bytes")
        return ts, rid.hex()

    def line(self, root: Sequence[Any], children: Mapping[str, Rows]) -> bytes:
        """One canonical line ``{"children":{table:[..]},"root":{..}}\\n`` (UTF-8).
        ``children`` maps a child table name to this root's rows (missing = none)."""
        kids = {t.name: [t.object(r) for r in children.get(t.name, ())] for t in self._children}
        try:  # every object's keys are in sorted order: canonical without sorting again
            return presorted_line({"children": kids, "root": self._root.object(root)})
        except UnicodeEncodeError:  # a lone surrogate in some text: name its column
            raise self._surrogate(root, children) from None

    def _surrogate(self, root: Sequence[Any], children: Mapping[str, Rows]) -> SourceInvalid:
        tables = [(self._root, [root]), *((t, children.get(t.name, ())) for t in self._children)]
        for table, rows in tables:
            for row in rows:
                failure = table.first_failure(row)
                if failure is not None:
                    return failure
        return SourceInvalid("text is not encodable as UTF-8 (lone surrogate)")
