"""Batch lines of ``orbit-archive/1`` straight from database row tuples (SPEC §6). Pure.

:func:`fileformat.build_batch` encodes ``RootRecord`` dicts through ``json.dumps(sort_keys=True)``
per line; the archive's hot path reads rows as tuples and encodes them here instead, with the
column order sorted once per table and one C-level string escape per text value. The output is
byte-for-byte the canonical line ``build_batch`` writes (the unit tests compare both on every
history kind, and every decoder re-checks canonical form), so a file has one valid spelling
whichever path built it.

Values are dispatched on their exact type: ``str`` (text; also datetimes the server already
formatted as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, see :mod:`orbit_tasks.archive.source`), ``bytes``
(lowercase hex), ``int``, ``None``, ``bool``, naive ``datetime``; anything else goes through
:func:`fileformat.encode_value`, which raises :class:`SourceInvalid` for values that cannot be
encoded exactly (floats, decimals...). Errors name ``table.column``, never the value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from json.encoder import encode_basestring  # what json.dumps(ensure_ascii=False) uses
from typing import Any

from orbit_tasks.archive.fileformat import SourceInvalid, canonical_json, encode_value, format_ts

Key = tuple[str, str]  # (settled as YYYY-MM-DDTHH:MM:SS.ffffffZ, id hex): a root's order key
_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def _generic(value: Any) -> str:
    """Anything the fast table below does not cover: the format's general rule (raises
    SourceInvalid for floats, decimals and other values that cannot be encoded exactly)."""
    return canonical_json(encode_value(value))[:-1].decode("utf-8")


def _datetime(value: datetime) -> str:
    if value.tzinfo is not None:
        return _generic(value)
    return '"' + format_ts(value) + '"'


# exact type -> JSON text; ``str`` is the C escaper json.dumps(ensure_ascii=False) itself uses
_BY_TYPE: dict[type, Callable[[Any], str]] = {
    str: encode_basestring,
    bytes: lambda v: '"' + v.hex() + '"',
    int: int.__repr__,
    type(None): lambda v: "null",
    bool: lambda v: "true" if v else "false",
    datetime: _datetime,
}


def _json_value(value: Any) -> str:
    return _BY_TYPE.get(type(value), _generic)(value)


class _Table:
    """One table's columns in canonical (sorted) key order, with their ``"name":`` prefixes."""

    def __init__(self, name: str, columns: Sequence[str]) -> None:
        self.name = name
        self.columns = list(columns)
        order = sorted(range(len(columns)), key=lambda i: columns[i])
        self.fields = [(i, encode_basestring(columns[i]) + ":") for i in order]

    def object(self, row: Sequence[Any]) -> str:
        by_type, generic = _BY_TYPE, _generic
        try:
            values = [p + by_type.get(type(row[i]), generic)(row[i]) for i, p in self.fields]
            return "{" + ",".join(values) + "}"
        except SourceInvalid:
            raise self.first_failure(row) or SourceInvalid(f"{self.name}: bad value") from None

    def first_failure(self, row: Sequence[Any]) -> SourceInvalid | None:
        """The error of the first column that cannot be encoded, named ``table.column``."""
        for i, column in enumerate(self.columns):
            try:
                encode_value(row[i])
            except SourceInvalid as exc:
                return SourceInvalid(f"{self.name}.{column}: {exc}")
        return None


Rows = Sequence[Sequence[Any]]


class LineEncoder:
    """Encodes roots of one history kind: ``root_columns`` in the order of the row tuples,
    ``children`` = (table name, its columns) in any order (lines list them sorted)."""

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
        self._child_keys = [encode_basestring(t.name) + ":[" for t in self._children]

    def root_id(self, root: Sequence[Any]) -> bytes:
        return bytes(root[self._id])

    def key(self, root: Sequence[Any]) -> Key:
        """The root's (settled, id) key as the header's ``first``/``last`` spell it."""
        settled, rid = root[self._settled], root[self._id]
        if type(settled) is str and _TS.match(settled):
            ts = settled
        elif isinstance(settled, datetime):
            ts = format_ts(settled)
        else:
            raise SourceInvalid("root settled column is not a datetime (unsettled root?)")
        if type(rid) is not bytes or len(rid) != 16:
            raise SourceInvalid("root id is not 16 bytes")
        return ts, rid.hex()

    def line(self, root: Sequence[Any], children: Mapping[str, Rows]) -> bytes:
        """One canonical line ``{"children":{table:[..]},"root":{..}}\n`` (UTF-8).
        ``children`` maps a child table name to this root's rows (missing = none)."""
        kids = ",".join(
            key + ",".join(t.object(r) for r in children.get(t.name, ())) + "]"
            for t, key in zip(self._children, self._child_keys, strict=True)
        )
        text = '{"children":{' + kids + '},"root":' + self._root.object(root) + "}\n"
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            raise self._surrogate(root, children) from None

    def _surrogate(self, root: Sequence[Any], children: Mapping[str, Rows]) -> SourceInvalid:
        tables = [(self._root, [root]), *((t, children.get(t.name, ())) for t in self._children)]
        for table, rows in tables:
            for row in rows:
                failure = table.first_failure(row)
                if failure is not None:
                    return failure
        return SourceInvalid("text is not encodable as UTF-8 (lone surrogate)")
