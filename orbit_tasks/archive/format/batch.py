"""Batch files of a job (SPEC §6, docs/archive-format.md): ``<seq:08d>-<sha256>.jsonl.gz``,
seq 1..N, one gzip member (:mod:`orbit_tasks.archive.format.gzip_member`). Line 1 is the header
``{"format","job_id","seq","prev_sha256","roots","first","last","final"}``, then one
``{"root":{..},"children":{table:[..]}}`` line per root in (settled, id) order. Pure: bytes in,
bytes out, no I/O, no clock.

* ``<sha256>`` = lowercase hex SHA-256 of the file as stored. Link 0 = the manifest's hash
  (:mod:`orbit_tasks.archive.format.manifest`); every header's ``prev_sha256`` is the previous
  link; ``last_sha256`` in the job row is the last link.
* Batch files are the same in formats 1 and 2 (their header still says ``orbit-archive/1``).
* Line splitting uses ``\\n`` only (never ``str.splitlines``, which would also split on
  U+2028, U+001C...). ``json.dumps`` escapes newlines inside strings, so ``\\n`` ends a line.
* An empty batch is never built (:func:`build_batch` raises ``ValueError``); an empty range is a
  manifest with ``roots_total`` 0 and no batches.

Values and canonical JSON: :mod:`orbit_tasks.archive.format.values`. Chain verification:
:mod:`orbit_tasks.archive.format.chain`.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orbit_tasks.archive.format.gzip_member import GzipRefused, gunzip_member, gzip_member
from orbit_tasks.archive.format.names import HEX64, MAX_SEQ, batch_name, check_sha
from orbit_tasks.archive.format.values import (
    FORMAT,
    HEX32,
    FormatError,
    SourceInvalid,
    canonical_json,
    encode_value,
    format_ts,
    hex_id,
    is_int,
    is_ts,
    loads_canonical,
    loads_canonical_text,
    need,
    parse_ts,
)

if TYPE_CHECKING:
    pass

HEADER_KEYS = frozenset(
    {"format", "job_id", "seq", "prev_sha256", "roots", "first", "last", "final"}
)

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
        "job_id": hex_id(job_id, "job_id"),
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
    need(len(data) >= 18 and data[:4] == b"\x1f\x8b\x08\x00", "batch is not gzip (deflate)")
    dec = zlib.decompressobj(-zlib.MAX_WBITS)
    out, pos = b"", 10
    try:
        while b"\n" not in out and pos < len(data) and len(out) < 65536:
            out += dec.decompress(data[pos : pos + 4096], 65536 - len(out))
            pos += 4096
    except zlib.error:
        raise FormatError("batch gzip stream is corrupt") from None
    need(b"\n" in out, "batch header line is missing")
    header = loads_canonical(out[: out.index(b"\n") + 1], "batch header")
    need(isinstance(header, dict) and set(header) == HEADER_KEYS, "batch header keys differ")
    prev = header["prev_sha256"]
    need(isinstance(prev, str) and bool(HEX64.match(prev)), "batch header prev_sha256 bad")
    return dict(header)


def _is_key(v: Any) -> bool:
    return (
        isinstance(v, list)
        and len(v) == 2
        and is_ts(v[0])
        and isinstance(v[1], str)
        and bool(HEX32.match(v[1]))
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
    need(payload.endswith(b"\n"), "batch does not end with a newline")
    head_end = payload.index(b"\n")
    header = loads_canonical(payload[: head_end + 1], "batch header")
    need(isinstance(header, dict) and set(header) == HEADER_KEYS, "batch header keys differ")
    need(header["format"] == FORMAT, "batch format is not orbit-archive/1")
    need(isinstance(header["job_id"], str) and bool(HEX32.match(header["job_id"])), "job_id bad")
    need(is_int(header["seq"], 1) and header["seq"] <= MAX_SEQ, "batch header seq bad")
    prev = header["prev_sha256"]
    need(isinstance(prev, str) and bool(HEX64.match(prev)), "batch header prev_sha256 bad")
    need(is_int(header["roots"], 1), "batch header roots bad")
    need(_is_key(header["first"]) and _is_key(header["last"]), "batch header first/last bad")
    need(isinstance(header["final"], bool), "batch header final bad")
    need(tuple(header["first"]) <= tuple(header["last"]), "batch header first > last")
    need(header["roots"] > 1 or header["first"] == header["last"], "batch first != last")
    body = payload[head_end + 1 : -1]  # the root lines without the last newline
    count = body.count(b"\n") + 1 if body else 0
    need(count == header["roots"], "batch line count differs from header roots")
    if lines == "ends":  # (b"\n" never occurs inside a UTF-8 sequence)
        need(not body.startswith(b"\n") and b"\n\n" not in body, "batch line is empty")
        ends = [body[: body.index(b"\n")], body[body.rindex(b"\n") + 1 :]] if count > 1 else [body]
    else:
        ends = [body]
    try:  # one UTF-8 decode for all lines (or both ends)
        texts = [t for raw in ends for t in raw.decode("utf-8").split("\n")]
    except UnicodeDecodeError:
        raise FormatError("batch line is not UTF-8 JSON") from None
    parsed: list[dict[str, Any]] = []
    for text in texts:
        line = loads_canonical_text(text, "batch line")
        need(isinstance(line, dict) and set(line) == {"root", "children"}, "batch line keys bad")
        need(isinstance(line["root"], dict), "batch line root bad")
        kids = line["children"]
        need(isinstance(kids, dict), "batch line children bad")
        for rows in kids.values():
            need(isinstance(rows, list) and all(isinstance(r, dict) for r in rows), "child bad")
        parsed.append(line)
    if settled_column is not None:
        keys = [(ln["root"].get(settled_column), ln["root"].get("id")) for ln in parsed]
        for k in keys:
            need(_is_key(list(k)), "root settled/id value bad")
        need(all(a < b for a, b in zip(keys, keys[1:], strict=False)), "roots out of order")
        need(list(keys[0]) == header["first"], "batch header first differs from first root")
        need(list(keys[-1]) == header["last"], "batch header last differs from last root")
    return DecodedBatch(header, parsed)


def batch_cursor(header: Mapping[str, Any]) -> tuple[datetime, bytes]:
    """The header's ``last`` as (settled, id): the next batch starts strictly after it."""
    ts, rid = header["last"]
    return parse_ts(ts), bytes.fromhex(rid)
