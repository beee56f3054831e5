"""The archive file format ``orbit-archive/1`` and ``/2`` (SPEC §6, docs/archive-format.md):
encode, decode, verify. Pure: bytes in, bytes out, no I/O, no clock.

New jobs write ``orbit-archive/2`` manifests, whose ``source`` also describes every table
(:mod:`orbit_tasks.archive.format.tables`); batch files are the same in both formats (their
header still says ``orbit-archive/1``). Readers accept both manifest formats.

Files of one job (``<volume>/<namespace_hex>/<job_hex>/``):

* ``00000000-<sha256>.json``: the manifest, canonical JSON (:func:`build_manifest`).
* ``<seq:08d>-<sha256>.jsonl.gz``, seq 1..N: batches (:func:`build_batch`). Line 1 is the header
  ``{"format","job_id","seq","prev_sha256","roots","first","last","final"}``, then one
  ``{"root":{..},"children":{table:[..]}}`` line per root in (settled, id) order.
* ``<sha256>`` = lowercase hex SHA-256 of the file as stored. Link 0 = the manifest's hash; every
  header's ``prev_sha256`` is the previous link; ``last_sha256`` in the job row is the last link.

Decisions (document-worthy):

* Every JSON text (manifest, each batch line) is canonical: sorted keys, separators ``,``/``:``,
  raw UTF-8 (``ensure_ascii=False``), one ``\\n``. Decoders re-encode and require the same bytes,
  so a file has exactly one valid spelling.
* Values: bytes -> lowercase hex; datetime -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (naive = UTC,
  aware is converted); str -> itself (JSON columns stay the stored text, numbers stay exact);
  bool -> true/false; int -> integer; None -> null. float, Decimal and anything else raise
  :class:`SourceInvalid` (no DECIMAL/FLOAT columns exist; a float would lose exactness).
* Gzip members have one shape (:mod:`orbit_tasks.archive.format.gzip_member`).
* Line splitting uses ``\\n`` only (never ``str.splitlines``, which would also split on
  U+2028, U+001C...). ``json.dumps`` escapes newlines inside strings, so ``\\n`` ends a line.
* An empty batch is never built (:func:`build_batch` raises ``ValueError``); an empty range is a
  manifest with ``roots_total`` 0 and no batches.

Chain verification is :mod:`orbit_tasks.archive.format.chain` (:func:`verify_chain`,
:func:`verify_prefix`) against a :class:`~orbit_tasks.archive.format.expectation.ChainExpectation`.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from orbit_tasks.archive.format.gzip_member import GzipRefused, gunzip_member, gzip_member
from orbit_tasks.archive.format.names import HEX64, MAX_SEQ, batch_name, check_sha
from orbit_tasks.errors import OrbitError

if TYPE_CHECKING:
    from orbit_tasks.platform.history import HistoryKind

FORMAT = "orbit-archive/1"  # batch files (unchanged by format 2) and format-1 manifests
FORMAT_1 = FORMAT
FORMAT_2 = "orbit-archive/2"  # manifests whose source describes the tables (SPEC §6)
MANIFEST_FORMAT = FORMAT_2  # what new jobs write
MANIFEST_FORMATS = (FORMAT_1, FORMAT_2)  # what readers accept
# fmt: off
MANIFEST_KEYS = frozenset((
    "format", "namespace_id", "job_id", "kind", "plan_revision", "policy_revision", "storage_id",
    "batch_size", "range", "roots_total", "source", "created_at",
))
# fmt: on
HEADER_KEYS = frozenset(
    {"format", "job_id", "seq", "prev_sha256", "roots", "first", "last", "final"}
)

_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$", re.ASCII)
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


class SourceInvalid(OrbitError):
    """A source row value cannot be encoded exactly (job error code ``SOURCE_INVALID``)."""


class FormatError(OrbitError):
    """Bytes that are not a valid ``orbit-archive/1`` manifest or batch."""


# --------------------------------------------------------------------------- values and names


# One encoder and one decoder for every call: json.dumps/json.loads with options build a new
# (Python-level) coder object per call, a third of the cost of a short line.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _reject_float(text: str) -> Any:
    raise ValueError("non-integer number")


_DECODER = json.JSONDecoder(parse_float=_reject_float, parse_constant=_reject_float)


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, ``,``/``:`` separators, raw UTF-8, one trailing newline."""
    try:
        text = _CANONICAL.encode(obj)
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        raise SourceInvalid("text is not encodable as UTF-8 (lone surrogate)") from None
    except (TypeError, ValueError) as exc:
        reason = type(exc).__name__
        raise SourceInvalid(f"value not encodable as canonical JSON: {reason}") from None


def format_ts(dt: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ``; naive datetimes are UTC, aware ones are converted."""
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC).replace(tzinfo=None)
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T"
        f"{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}.{dt.microsecond:06d}Z"
    )


def parse_ts(s: str) -> datetime:
    """Inverse of :func:`format_ts`; returns a naive UTC datetime. Strict: raises FormatError."""
    if not isinstance(s, str) or not _TS.match(s):
        raise FormatError("timestamp is not YYYY-MM-DDTHH:MM:SS.ffffffZ")
    try:  # the pattern fixed the shape; fromisoformat is ~10x faster than strptime
        return datetime.fromisoformat(s[:-1])
    except ValueError:
        raise FormatError("timestamp is not a valid date and time") from None


def encode_value(value: Any) -> Any:
    """One database value as a JSON value (see the module docstring)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise SourceInvalid("text is not encodable as UTF-8 (lone surrogate)") from None
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, datetime):
        return format_ts(value)
    raise SourceInvalid(f"values of type {type(value).__name__} cannot be encoded exactly")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hex_id(value: bytes, what: str) -> str:
    if not isinstance(value, bytes | bytearray) or len(value) != 16:
        raise ValueError(f"{what} must be 16 bytes")
    return bytes(value).hex()


def _int(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} {value!r} must be an integer >= {low}")
    return value


# --------------------------------------------------------------------------- manifest


def source_descriptor(kind: HistoryKind) -> dict[str, Any]:
    """The ``orbit-archive/2`` manifest ``source`` of a history kind: tables, settled and parent
    columns, and each table's columns (type, nullability, encoding) and primary key, derived
    from the table objects (:mod:`orbit_tasks.archive.format.tables`)."""
    from orbit_tasks.archive.format.tables import describe_table

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
) -> bytes:
    """The ``orbit-archive/2`` manifest bytes (canonical JSON); ``source`` as built by
    :func:`source_descriptor`. Raises ``ValueError`` on malformed arguments."""
    doc = {
        "format": MANIFEST_FORMAT,
        "namespace_id": _hex_id(namespace_id, "namespace_id"),
        "job_id": _hex_id(job_id, "job_id"),
        "kind": kind,
        "plan_revision": _int(plan_revision, "plan_revision", 1),
        "policy_revision": _int(policy_revision, "policy_revision", 1),
        "storage_id": _hex_id(storage_id, "storage_id"),
        "batch_size": _int(batch_size, "batch_size", 1),
        "range": {
            "from": None if range_from is None else format_ts(range_from),
            "until": format_ts(range_until),
        },
        "roots_total": _int(roots_total, "roots_total", 0),
        "source": dict(source),
        "created_at": format_ts(created_at),
    }
    data = canonical_json(doc)
    try:
        decode_manifest(data)
    except FormatError as exc:
        raise ValueError(f"manifest arguments are invalid: {exc}") from None
    return data


def _loads_canonical(raw: bytes, what: str) -> Any:
    try:
        obj = _DECODER.decode(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise FormatError(f"{what} is not UTF-8 JSON") from None
    try:
        again = canonical_json(obj)
    except SourceInvalid:
        raise FormatError(f"{what} is not canonical JSON") from None
    if again != raw:
        raise FormatError(f"{what} is not canonical JSON")
    return obj


def _loads_canonical_text(text: str, what: str) -> Any:
    """:func:`_loads_canonical` for one line already decoded from UTF-8 (without its newline)."""
    try:
        obj = _DECODER.decode(text)
    except ValueError:
        raise FormatError(f"{what} is not UTF-8 JSON") from None
    try:
        again = _CANONICAL.encode(obj)
    except (TypeError, ValueError):
        raise FormatError(f"{what} is not canonical JSON") from None
    if again != text:  # a lone surrogate re-encodes raw, never as the escape it was read from
        raise FormatError(f"{what} is not canonical JSON")
    return obj


def _need(cond: bool, reason: str) -> None:
    if not cond:
        raise FormatError(reason)


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _is_ts(v: Any) -> bool:
    try:
        parse_ts(v)
    except FormatError:
        return False
    return True


def decode_manifest(data: bytes) -> dict[str, Any]:
    """Parse and validate a manifest of format 1 or 2; raises :class:`FormatError` naming what
    is wrong. Both formats have the same keys; format 2's ``source`` also describes the tables."""
    doc = _loads_canonical(data, "manifest")
    _need(isinstance(doc, dict), "manifest is not a JSON object")
    _need(set(doc) == MANIFEST_KEYS, "manifest keys differ from orbit-archive/1 and /2")
    _need(doc["format"] in MANIFEST_FORMATS, "manifest format is not orbit-archive/1 or /2")
    for key in ("namespace_id", "job_id", "storage_id"):
        _need(isinstance(doc[key], str) and bool(_HEX32.match(doc[key])), f"manifest {key} bad")
    _need(isinstance(doc["kind"], str) and doc["kind"] != "", "manifest kind bad")
    for key in ("plan_revision", "policy_revision", "batch_size"):
        _need(_is_int(doc[key], 1), f"manifest {key} bad")
    _need(_is_int(doc["roots_total"]), "manifest roots_total bad")
    rng = doc["range"]
    _need(isinstance(rng, dict) and set(rng) == {"from", "until"}, "manifest range bad")
    _need(rng["from"] is None or _is_ts(rng["from"]), "manifest range.from bad")
    _need(_is_ts(rng["until"]), "manifest range.until bad")
    _need(_is_ts(doc["created_at"]), "manifest created_at bad")
    src = doc["source"]
    if doc["format"] == FORMAT_2:
        from orbit_tasks.archive.format.tables import parse_source

        parse_source(src)
        return doc
    _need(
        isinstance(src, dict) and set(src) == {"table", "settled_column", "children"},
        "manifest source bad",
    )
    _need(isinstance(src["table"], str) and isinstance(src["settled_column"], str), "source bad")
    _need(isinstance(src["children"], list), "manifest source.children bad")
    for child in src["children"]:
        _need(
            isinstance(child, dict)
            and set(child) == {"table", "parent_column"}
            and all(isinstance(v, str) for v in child.values()),
            "manifest source.children entry bad",
        )
    return doc


# --------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class RootRecord:
    """One root row and its children: raw DB values (column -> value); ``children`` keyed by child
    table name (every child table of the kind, possibly empty), rows in a deterministic order."""

    root: Mapping[str, Any]
    children: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodedBatch:
    header: dict[str, Any]
    lines: list[dict[str, Any]]


def _encode_row(row: Mapping[str, Any], table: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col, value in row.items():
        try:
            out[str(col)] = encode_value(value)
        except SourceInvalid as exc:
            raise SourceInvalid(f"{table}.{col}: {exc}") from None
    return out


def _root_key(root: Mapping[str, Any], settled_column: str) -> tuple[str, str]:
    settled, rid = root.get(settled_column), root.get("id")
    if not isinstance(settled, datetime):
        raise SourceInvalid(f"root {settled_column} is not a datetime (unsettled root?)")
    if not isinstance(rid, bytes | bytearray) or len(rid) != 16:
        raise SourceInvalid("root id is not 16 bytes")
    return format_ts(settled), bytes(rid).hex()


def build_batch(
    *,
    job_id: bytes,
    seq: int,
    prev_sha256: str,
    records: Sequence[RootRecord],
    settled_column: str,
    final: bool,
) -> bytes:
    """Batch file bytes. ``records`` must be non-empty, in strictly increasing (settled, id)
    order, all with the same child tables. Raises :class:`SourceInvalid` for unencodable values,
    ``ValueError`` for malformed arguments (empty batch, bad seq/hash, order)."""
    if not records:
        raise ValueError("a batch needs at least one root (empty ranges have no batches)")
    check_sha(prev_sha256)
    batch_name(seq, prev_sha256)  # validates seq
    keys = [_root_key(r.root, settled_column) for r in records]
    if any(a >= b for a, b in zip(keys, keys[1:], strict=False)):
        raise ValueError("roots are not in strictly increasing (settled, id) order")
    tables = set(records[0].children)
    lines = []
    for rec in records:
        if set(rec.children) != tables:
            raise ValueError("every root of a batch must list the same child tables")
        children = {
            t: [_encode_row(row, t) for row in rows] for t, rows in sorted(rec.children.items())
        }
        lines.append(canonical_json({"root": _encode_row(rec.root, "root"), "children": children}))
    return build_batch_file(
        job_id=job_id,
        seq=seq,
        prev_sha256=prev_sha256,
        lines=lines,
        first=keys[0],
        last=keys[-1],
        final=final,
    )


def build_batch_file(
    *,
    job_id: bytes,
    seq: int,
    prev_sha256: str,
    lines: Sequence[bytes],
    first: tuple[str, str],
    last: tuple[str, str],
    final: bool,
) -> bytes:
    """Batch file bytes from canonical root lines already encoded (by :func:`build_batch` or
    :class:`orbit_tasks.archive.format.lines.LineEncoder`), in (settled, id) order, with the
    keys of the first and last root. The header is built here; gzip as described above."""
    if not lines:
        raise ValueError("a batch needs at least one root (empty ranges have no batches)")
    check_sha(prev_sha256)
    batch_name(seq, prev_sha256)  # validates seq
    header = {
        "format": FORMAT,
        "job_id": _hex_id(job_id, "job_id"),
        "seq": seq,
        "prev_sha256": prev_sha256,
        "roots": len(lines),
        "first": list(first),
        "last": list(last),
        "final": bool(final),
    }
    return gzip_member(canonical_json(header) + b"".join(lines))


def batch_header(data: bytes) -> dict[str, Any]:
    """Only the header line of a batch file, inflating no further than it (the chain walk back
    from a tail reads ``prev_sha256`` without decoding the roots). Checks the header's own form;
    the file's hash, CRC and lines are the full decoder's business."""
    _need(len(data) >= 18 and data[:4] == b"\x1f\x8b\x08\x00", "batch is not gzip (deflate)")
    dec = zlib.decompressobj(-zlib.MAX_WBITS)
    out, pos = b"", 10
    try:
        while b"\n" not in out and pos < len(data) and len(out) < 65536:
            out += dec.decompress(data[pos : pos + 4096], 65536 - len(out))
            pos += 4096
    except zlib.error:
        raise FormatError("batch gzip stream is corrupt") from None
    _need(b"\n" in out, "batch header line is missing")
    header = _loads_canonical(out[: out.index(b"\n") + 1], "batch header")
    _need(isinstance(header, dict) and set(header) == HEADER_KEYS, "batch header keys differ")
    prev = header["prev_sha256"]
    _need(isinstance(prev, str) and bool(HEX64.match(prev)), "batch header prev_sha256 bad")
    return dict(header)


def _is_key(v: Any) -> bool:
    return (
        isinstance(v, list)
        and len(v) == 2
        and _is_ts(v[0])
        and isinstance(v[1], str)
        and bool(_HEX32.match(v[1]))
    )


def decode_batch(
    data: bytes, *, settled_column: str | None = None, lines: str = "all"
) -> DecodedBatch:
    """Parse and validate a batch file. Structural checks always; with ``settled_column`` also
    every parsed root's key, strict (settled, id) order and that ``first``/``last`` match the
    lines. ``lines="ends"`` parses only the first and the last line (the others are counted and
    must be non-empty) and returns those two: every byte is still covered by the gzip CRC and
    the file's SHA-256, but no other line is decoded (the runner's chain checks; ``orbit job
    verify`` and export parse every line)."""
    try:
        payload = gunzip_member(data)
    except GzipRefused as exc:
        raise FormatError(str(exc)) from None
    _need(payload.endswith(b"\n"), "batch does not end with a newline")
    head_end = payload.index(b"\n")
    header = _loads_canonical(payload[: head_end + 1], "batch header")
    _need(isinstance(header, dict) and set(header) == HEADER_KEYS, "batch header keys differ")
    _need(header["format"] == FORMAT, "batch format is not orbit-archive/1")
    _need(isinstance(header["job_id"], str) and bool(_HEX32.match(header["job_id"])), "job_id bad")
    _need(_is_int(header["seq"], 1) and header["seq"] <= MAX_SEQ, "batch header seq bad")
    prev = header["prev_sha256"]
    _need(isinstance(prev, str) and bool(HEX64.match(prev)), "batch header prev_sha256 bad")
    _need(_is_int(header["roots"], 1), "batch header roots bad")
    _need(_is_key(header["first"]) and _is_key(header["last"]), "batch header first/last bad")
    _need(isinstance(header["final"], bool), "batch header final bad")
    _need(tuple(header["first"]) <= tuple(header["last"]), "batch header first > last")
    _need(header["roots"] > 1 or header["first"] == header["last"], "batch first != last")
    body = payload[head_end + 1 : -1]  # the root lines without the last newline
    count = body.count(b"\n") + 1 if body else 0
    _need(count == header["roots"], "batch line count differs from header roots")
    if lines == "ends":  # (b"\n" never occurs inside a UTF-8 sequence)
        _need(not body.startswith(b"\n") and b"\n\n" not in body, "batch line is empty")
        ends = [body[: body.index(b"\n")], body[body.rindex(b"\n") + 1 :]] if count > 1 else [body]
    else:
        ends = [body]
    try:  # one UTF-8 decode for all lines (or both ends)
        texts = [t for raw in ends for t in raw.decode("utf-8").split("\n")]
    except UnicodeDecodeError:
        raise FormatError("batch line is not UTF-8 JSON") from None
    parsed: list[dict[str, Any]] = []
    for text in texts:
        line = _loads_canonical_text(text, "batch line")
        _need(isinstance(line, dict) and set(line) == {"root", "children"}, "batch line keys bad")
        _need(isinstance(line["root"], dict), "batch line root bad")
        kids = line["children"]
        _need(isinstance(kids, dict), "batch line children bad")
        for rows in kids.values():
            _need(isinstance(rows, list) and all(isinstance(r, dict) for r in rows), "child bad")
        parsed.append(line)
    if settled_column is not None:
        keys = [(ln["root"].get(settled_column), ln["root"].get("id")) for ln in parsed]
        for k in keys:
            _need(_is_key(list(k)), "root settled/id value bad")
        _need(all(a < b for a, b in zip(keys, keys[1:], strict=False)), "roots out of order")
        _need(list(keys[0]) == header["first"], "batch header first differs from first root")
        _need(list(keys[-1]) == header["last"], "batch header last differs from last root")
    return DecodedBatch(header, parsed)


def batch_cursor(header: Mapping[str, Any]) -> tuple[datetime, bytes]:
    """The header's ``last`` as (settled, id): the next batch starts strictly after it."""
    ts, rid = header["last"]
    return parse_ts(ts), bytes.fromhex(rid)
