"""Rows of a restore against their table description (docs/archive-format.md, "Restore"): an
archived row decoded into database values, compared with the row already in the target, its
primary key for lookups and reports, and whether an existing target table can take the rows.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from orbit_tasks.archive.format.tables import TableSpec
from orbit_tasks.archive.format.values import FormatError, format_ts


def decode_row(spec: TableSpec, row: Mapping[str, Any]) -> dict[str, Any]:
    """An archived row (column -> JSON value) as database values; its columns must be exactly
    the described ones."""
    if row.keys() != spec.name_set:
        missing = sorted(spec.name_set - set(row))
        extra = sorted(set(row) - spec.name_set)
        raise FormatError(
            f"{spec.name}: archived row columns differ from the description "
            f"(missing {missing or 'none'}, extra {extra or 'none'})"
        )
    return {name: decode(row[name]) for name, decode in spec.decoders}


def _normal(value: Any) -> Any:
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def differing_columns(
    spec: TableSpec, wanted: Mapping[str, Any], found: Sequence[Any]
) -> list[str]:
    """Columns whose value in the target (``found``: the values in ``spec.names`` order) is
    not exactly the archived one (same type and value)."""
    names = spec.names
    values = tuple(wanted[n] for n in names)
    if values == tuple(found):
        return []  # the common case of a re-run, in one comparison
    return [n for n, a, b in zip(names, values, found, strict=True) if _normal(b) != a]


def key_json(spec: TableSpec, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's primary key as printable JSON (hex ids, timestamps, integers)."""
    out: dict[str, Any] = {}
    for name in spec.primary_key:
        value = row[name]
        if isinstance(value, bytes):
            out[name] = value.hex()
        elif isinstance(value, datetime):
            out[name] = format_ts(value)
        else:
            out[name] = value
    return out


def primary_key_of(spec: TableSpec, row: Mapping[Any, Any]) -> tuple[Any, ...]:
    return tuple(_normal(row[name]) for name in spec.primary_key)


def primary_key_at(spec: TableSpec, values: Sequence[Any]) -> tuple[Any, ...]:
    """The primary key of a row given as values in ``spec.names`` order."""
    return tuple(_normal(values[i]) for i in spec.key_positions)


def check_columns(spec: TableSpec, existing: Sequence[Mapping[str, Any]]) -> list[str]:
    """Problems of an existing target table (reflected columns) for rows of ``spec``: a missing
    column, another kind of type, a DATETIME without microseconds, a shorter type, or an extra
    NOT NULL column without a default (an insert would fail)."""
    from sqlalchemy import types as t

    found = {c["name"]: c for c in existing}
    problems = []
    for col in spec.columns:
        have = found.get(col.name)
        if have is None:
            problems.append(f"column {col.name} is missing")
            continue
        typ = have["type"]
        family = (
            "hex"
            if isinstance(typ, t._Binary)
            else "integer"
            if isinstance(typ, t.Integer)
            else "timestamp"
            if isinstance(typ, t.DateTime)
            else "text"
            if isinstance(typ, t.String)
            else "?"
        )
        if family != col.encoding:
            problems.append(f"column {col.name} is {typ} (archive: {col.type})")
        elif col.encoding == "timestamp" and hasattr(typ, "fsp") and typ.fsp != 6:
            problems.append(f"column {col.name} is {typ} without microseconds (need DATETIME(6))")
        elif col.length and getattr(typ, "length", None) and typ.length < col.length:
            problems.append(f"column {col.name} is {typ}, shorter than {col.type}")
    for name, have in found.items():
        required = not have.get("nullable", True) and have.get("default") is None
        if name not in spec.names and required and have.get("autoincrement") is not True:
            problems.append(f"extra column {name} is NOT NULL without a default")
    return problems
