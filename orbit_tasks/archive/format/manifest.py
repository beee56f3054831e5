"""The manifest of a job (SPEC §6, docs/archive-format.md): ``00000000-<sha256>.json``,
canonical JSON. New jobs write ``orbit-archive/2`` manifests, whose ``source`` also describes every
table (:mod:`orbit_tasks.archive.format.tables`); readers accept formats 1 and 2. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orbit_tasks.archive.format.tables import describe_table, parse_source
from orbit_tasks.archive.format.values import (
    FORMAT_2,
    HEX32,
    MANIFEST_FORMAT,
    MANIFEST_FORMATS,
    FormatError,
    canonical_json,
    format_ts,
    hex_id,
    int_at_least,
    is_int,
    is_ts,
    loads_canonical,
    need,
)

if TYPE_CHECKING:
    from orbit_tasks.platform.history import HistoryKind

# fmt: off
MANIFEST_KEYS = frozenset((
    "format", "namespace_id", "job_id", "kind", "plan_revision", "policy_revision", "storage_id",
    "batch_size", "range", "roots_total", "source", "created_at",
))
# fmt: on
RANGE_KEYS = frozenset(("from", "until"))
KEYED_RANGE_KEYS = RANGE_KEYS | {"from_id", "until_id"}  # bounds that are keys (settled, id)


def source_descriptor(kind: HistoryKind) -> dict[str, Any]:
    """The ``orbit-archive/2`` manifest ``source`` of a history kind: tables, settled and parent
    columns, and each table's columns (type, nullability, encoding) and primary key, derived
    from the table objects (:mod:`orbit_tasks.archive.format.tables`)."""
    return {
        "table": kind.root.name,
        "settled_column": kind.settled_column,
        **describe_table(kind.root),
        "children": [
            {"table": c.table.name, "parent_column": c.parent_column, **describe_table(c.table)}
            for c in kind.children
        ],
    }


def build_manifest(
    *,
    namespace_id: bytes,
    job_id: bytes,
    kind: str,
    plan_revision: int,
    policy_revision: int,
    storage_id: bytes,
    batch_size: int,
    range_from: datetime | None,
    range_until: datetime,
    roots_total: int,
    source: Mapping[str, Any],
    created_at: datetime,
    range_from_id: bytes | None = None,
    range_until_id: bytes | None = None,
) -> bytes:
    """The ``orbit-archive/2`` manifest bytes (canonical JSON); ``source`` as built by
    :func:`source_descriptor`. Raises ``ValueError`` on malformed arguments."""
    doc = {
        "format": MANIFEST_FORMAT,
        "namespace_id": hex_id(namespace_id, "namespace_id"),
        "job_id": hex_id(job_id, "job_id"),
        "kind": kind,
        "plan_revision": int_at_least(plan_revision, "plan_revision", 1),
        "policy_revision": int_at_least(policy_revision, "policy_revision", 1),
        "storage_id": hex_id(storage_id, "storage_id"),
        "batch_size": int_at_least(batch_size, "batch_size", 1),
        "range": range_doc(range_from, range_until, range_from_id, range_until_id),
        "roots_total": int_at_least(roots_total, "roots_total", 0),
        "source": dict(source),
        "created_at": format_ts(created_at),
    }
    data = canonical_json(doc)
    try:
        decode_manifest(data)
    except FormatError as exc:
        raise ValueError(f"manifest arguments are invalid: {exc}") from None
    return data


def range_doc(
    range_from: datetime | None,
    range_until: datetime,
    from_id: bytes | None = None,
    until_id: bytes | None = None,
) -> dict[str, Any]:
    """The manifest's ``range``: ``from`` and ``until`` settled times, and for a bound that is a
    key (settled, id) (SPEC §5 budget-sized ranges) its root id as ``from_id`` / ``until_id``;
    a range of plain times has exactly the two keys of every earlier manifest."""
    doc: dict[str, Any] = {
        "from": None if range_from is None else format_ts(range_from),
        "until": format_ts(range_until),
    }
    if from_id is not None:
        if range_from is None:
            raise ValueError("range from_id needs a range from")
        doc["from_id"] = hex_id(from_id, "range from_id")
    if until_id is not None:
        doc["until_id"] = hex_id(until_id, "range until_id")
    return doc


def range_keys(doc: Mapping[str, Any]) -> tuple[tuple[str, str] | None, tuple[str, str]]:
    """A decoded manifest's range as keys comparable with batch header keys ``[settled, id]``
    (strings; a plain time bound has the id ``""``, which sorts before every id)."""
    rng = doc["range"]
    lo = None if rng["from"] is None else (rng["from"], rng.get("from_id", ""))
    return lo, (rng["until"], rng.get("until_id", ""))


def decode_manifest(data: bytes) -> dict[str, Any]:
    """Parse and validate a manifest of format 1 or 2; raises :class:`FormatError` naming what
    is wrong. Both formats have the same keys; format 2's ``source`` also describes the tables."""
    doc = loads_canonical(data, "manifest")
    need(isinstance(doc, dict), "manifest is not a JSON object")
    need(set(doc) == MANIFEST_KEYS, "manifest keys differ from orbit-archive/1 and /2")
    need(doc["format"] in MANIFEST_FORMATS, "manifest format is not orbit-archive/1 or /2")
    for key in ("namespace_id", "job_id", "storage_id"):
        need(isinstance(doc[key], str) and bool(HEX32.match(doc[key])), f"manifest {key} bad")
    need(isinstance(doc["kind"], str) and doc["kind"] != "", "manifest kind bad")
    for key in ("plan_revision", "policy_revision", "batch_size"):
        need(is_int(doc[key], 1), f"manifest {key} bad")
    need(is_int(doc["roots_total"]), "manifest roots_total bad")
    rng = doc["range"]
    need(isinstance(rng, dict) and RANGE_KEYS <= set(rng) <= KEYED_RANGE_KEYS, "manifest range bad")
    need(rng["from"] is None or is_ts(rng["from"]), "manifest range.from bad")
    need(is_ts(rng["until"]), "manifest range.until bad")
    for key in ("from_id", "until_id"):
        if key in rng:
            need(isinstance(rng[key], str) and bool(HEX32.match(rng[key])), f"range.{key} bad")
    need("from_id" not in rng or rng["from"] is not None, "manifest range.from_id without from")
    need(is_ts(doc["created_at"]), "manifest created_at bad")
    src = doc["source"]
    if doc["format"] == FORMAT_2:
        parse_source(src)
        return doc
    need(
        isinstance(src, dict) and set(src) == {"table", "settled_column", "children"},
        "manifest source bad",
    )
    need(isinstance(src["table"], str) and isinstance(src["settled_column"], str), "source bad")
    need(isinstance(src["children"], list), "manifest source.children bad")
    for child in src["children"]:
        need(
            isinstance(child, dict)
            and set(child) == {"table", "parent_column"}
            and all(isinstance(v, str) for v in child.values()),
            "manifest source.children entry bad",
        )
    return doc
