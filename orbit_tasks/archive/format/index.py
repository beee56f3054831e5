"""The id index of a SUCCEEDED job (issue 28 item 1, docs/archive-format.md "The id index"):
``index-<sha256>.json`` (the top) and ``shard-<xx>-<sha256>.bin`` (one per first byte ``xx`` of
the root ids that occur), written beside the chain in ``<ns_hex>/<job_hex>.index/``, never in
the job directory. Pure: bytes in, bytes out, no I/O, no clock.

* The top is one canonical JSON line: the job (namespace, kind, storage, ``batches``,
  ``roots``, ``last_sha256``), every chain file in order (the manifest, then each batch with
  its ``roots``, ``first`` and ``last`` keys) and every shard (name and entry count). Its
  SHA-256 is recorded in the platform database (``orbit_archive_job_indexes``), so the top is
  authentic when it hashes to that value; it vouches for the shards by their names.
* A shard is a canonical JSON header line, then fixed 24-byte entries sorted by root id:
  ``id`` (16 bytes), ``seq`` (the batch, u32 big-endian), ``line`` (the root's line in the
  batch, 1 = the first root after the header, u32 big-endian). A lookup is one binary search.
* Both are deterministic: the same chain gives the same bytes, so two builders write the same
  names and record the same hash.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from orbit_tasks.archive.format.names import HEX64, parse_name, tail_name
from orbit_tasks.archive.format.values import (
    HEX32,
    FormatError,
    canonical_json,
    is_int,
    is_ts,
    loads_canonical,
    need,
    sha256_hex,
)

INDEX_FORMAT = "orbit-index/1"
INDEX_DIR_SUFFIX = ".index"  # <ns_hex>/<job_hex>.index/ beside the job directory <job_hex>/
ENTRY = struct.Struct(">16sII")  # root id, batch seq, line in the batch
TOP_KEYS = frozenset(
    {"format", "namespace_id", "job_id", "kind", "storage_id", "batches", "roots",
     "last_sha256", "files", "shards"}
)  # fmt: skip
SHARD_KEYS = frozenset({"format", "job_id", "shard", "entries"})
_TOP_NAME = re.compile(r"^index-([0-9a-f]{64})\.json$")
_SHARD_NAME = re.compile(r"^shard-([0-9a-f]{2})-([0-9a-f]{64})\.bin$")


class IndexInvalid(FormatError):
    """Index bytes that are not what their name, the database or the top says."""


def top_name(sha: str) -> str:
    need(bool(HEX64.match(sha)), "index sha256 bad")
    return f"index-{sha}.json"


def shard_name(shard: int, sha: str) -> str:
    return f"shard-{shard:02x}-{sha}.bin"


def shard_of(root_id: bytes) -> int:
    """The shard of a root id: its first byte."""
    return root_id[0]


@dataclass(frozen=True)
class BatchSpan:
    """One batch of the chain as the top lists it."""

    name: str
    roots: int
    first: tuple[str, str]
    last: tuple[str, str]

    @property
    def sha256(self) -> str:
        parsed = parse_name(self.name)
        assert parsed is not None
        return parsed.sha256


@dataclass(frozen=True)
class Entry:
    root_id: bytes
    seq: int
    line: int


@dataclass(frozen=True)
class Top:
    """A parsed top: ``files[0]`` is the manifest, ``files[seq]`` batch seq. A file's entry is
    checked when it is used (:meth:`span`): the top is authentic by its hash, and a lookup
    uses two of its files, not the thousands a large job lists."""

    name: str
    namespace_id: str
    job_id: str
    kind: str
    storage_id: str
    batches: int
    roots: int
    last_sha256: str
    files: tuple[Any, ...]
    shards: dict[int, tuple[str, int]]  # shard -> (name, entries)

    def file_name(self, seq: int) -> str:
        f = self.files[seq]
        name = f.get("name") if isinstance(f, dict) else None
        parsed = parse_name(name) if isinstance(name, str) else None
        if parsed is None or parsed.seq != seq or parsed.is_manifest != (seq == 0):
            raise IndexInvalid(f"{self.name}: index file name bad at {seq}")
        return str(name)

    def link(self, seq: int) -> str:
        """The chain link (SHA-256) of file ``seq``."""
        parsed = parse_name(self.file_name(seq))
        assert parsed is not None
        return parsed.sha256

    def span(self, seq: int) -> BatchSpan:
        """Batch ``seq`` (1..batches) as the top lists it, checked."""
        name, f = self.file_name(seq), self.files[seq]
        try:
            need(set(f) == {"name", "roots", "first", "last"}, "index file keys differ")
            need(is_int(f["roots"], 1), "index file roots bad")
            for end in (f["first"], f["last"]):
                need(isinstance(end, list) and len(end) == 2 and is_ts(end[0]), "index key bad")
                need(isinstance(end[1], str) and bool(HEX32.match(end[1])), "index key bad")
        except FormatError as exc:
            raise IndexInvalid(f"{self.name}: {exc.args[0]} at {seq}") from None
        return BatchSpan(name, f["roots"], tuple(f["first"]), tuple(f["last"]))


def build_shard(job_id: bytes, shard: int, records: Sequence[bytes]) -> tuple[str, bytes]:
    """A shard's name and bytes from its packed entries (``ENTRY.pack(id, seq, line)``, every
    one of this shard, in any order)."""
    ordered = sorted(records)  # the id is the first 16 bytes of each record
    need(bool(ordered), "an empty shard is never written")
    for a, b in zip(ordered, ordered[1:], strict=False):
        need(a[:16] != b[:16], "a root id occurs twice in one job")
    for r in ordered:
        need(len(r) == ENTRY.size and r[0] == shard, "entry in the wrong shard")
    header = canonical_json(
        {"format": INDEX_FORMAT, "job_id": job_id.hex(), "shard": f"{shard:02x}",
         "entries": len(ordered)}
    )  # fmt: skip
    data = header + b"".join(ordered)
    return shard_name(shard, sha256_hex(data)), data


def build_top(
    *,
    namespace_id: bytes,
    job_id: bytes,
    kind: str,
    storage_id: bytes,
    manifest: str,
    spans: Sequence[BatchSpan],
    shards: dict[int, tuple[str, int]],
) -> tuple[str, bytes]:
    """The top's name and bytes for a verified chain (``spans`` in chain order)."""
    last = parse_name(spans[-1].name if spans else manifest)
    need(last is not None, "chain file name bad")
    assert last is not None
    doc: dict[str, Any] = {
        "format": INDEX_FORMAT,
        "namespace_id": namespace_id.hex(),
        "job_id": job_id.hex(),
        "kind": kind,
        "storage_id": storage_id.hex(),
        "batches": len(spans),
        "roots": sum(s.roots for s in spans),
        "last_sha256": last.sha256,
        "files": [{"name": manifest}]
        + [
            {"name": s.name, "roots": s.roots, "first": list(s.first), "last": list(s.last)}
            for s in spans
        ],
        "shards": [
            {"shard": f"{k:02x}", "name": name, "entries": n}
            for k, (name, n) in sorted(shards.items())
        ],
    }
    data = canonical_json(doc)
    return top_name(sha256_hex(data)), data


def parse_top(data: bytes, want_sha: str) -> Top:
    """Check and parse a top: it must hash to ``want_sha`` (the database's value), list
    ``batches + 1`` files, the last one named by ``last_sha256``, and its shards. (Canonical
    spelling and every file entry were checked by the builder; an entry is checked again
    when a lookup uses it.)"""
    name = top_name(want_sha)
    if sha256_hex(data) != want_sha:
        raise IndexInvalid(f"{name}: contents do not hash to the sha256 recorded for the job")
    try:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise FormatError("index is not JSON") from None
        need(isinstance(doc, dict) and set(doc) == TOP_KEYS, "index keys differ")
        need(doc["format"] == INDEX_FORMAT, "index format is not orbit-index/1")
        for key in ("namespace_id", "job_id", "storage_id"):
            need(isinstance(doc[key], str) and bool(HEX32.match(doc[key])), f"index {key} bad")
        need(isinstance(doc["kind"], str), "index kind bad")
        need(is_int(doc["batches"]) and is_int(doc["roots"]), "index counts bad")
        need(isinstance(doc["last_sha256"], str), "index last_sha256 bad")
        files = doc["files"]
        need(isinstance(files, list) and len(files) == doc["batches"] + 1, "index files bad")
        shards: dict[int, tuple[str, int]] = {}
        need(isinstance(doc["shards"], list), "index shards bad")
        for s in doc["shards"]:
            need(isinstance(s, dict) and set(s) == {"shard", "name", "entries"}, "shard bad")
            m = _SHARD_NAME.match(s["name"]) if isinstance(s["name"], str) else None
            need(m is not None and m.group(1) == s["shard"], "index shard name bad")
            need(is_int(s["entries"], 1), "index shard entries bad")
            shards[int(s["shard"], 16)] = (s["name"], s["entries"])
        need(sum(n for _, n in shards.values()) == doc["roots"], "index shards miss roots")
    except FormatError as exc:
        raise IndexInvalid(f"{name}: {exc.args[0]}") from None
    top = Top(
        name=name,
        namespace_id=doc["namespace_id"],
        job_id=doc["job_id"],
        kind=doc["kind"],
        storage_id=doc["storage_id"],
        batches=doc["batches"],
        roots=doc["roots"],
        last_sha256=doc["last_sha256"],
        files=tuple(files),
        shards=shards,
    )
    if top.link(top.batches) != top.last_sha256:
        raise IndexInvalid(f"{name}: index last_sha256 is not its last file")
    return top


def find_in_shard(
    name: str, data: bytes, *, job_id: str, shard: int, entries: int, root_id: bytes
) -> Entry | None:
    """Check a shard against its name and the top (job, shard, entry count) and binary-search
    ``root_id``; None when the job holds no such root."""
    m = _SHARD_NAME.match(name)
    if m is None or sha256_hex(data) != m.group(2):
        raise IndexInvalid(f"{name}: contents do not hash to the sha256 in the name")
    try:
        end = data.index(b"\n") + 1
        header = loads_canonical(data[:end], "index shard header")
        need(isinstance(header, dict) and set(header) == SHARD_KEYS, "shard header keys differ")
        need(header["format"] == INDEX_FORMAT, "shard format is not orbit-index/1")
        need(header["job_id"] == job_id, "shard job_id differs from the index")
        need(header["shard"] == f"{shard:02x}", "shard number differs from the index")
        need(header["entries"] == entries, "shard entries differ from the index")
        need(len(data) - end == entries * ENTRY.size, "shard length differs from its entries")
    except ValueError:
        raise IndexInvalid(f"{name}: shard header line is missing") from None
    except FormatError as exc:
        raise IndexInvalid(f"{name}: {exc.args[0]}") from None
    view = memoryview(data)[end:]
    lo, hi = 0, entries
    while lo < hi:
        mid = (lo + hi) // 2
        key = bytes(view[mid * ENTRY.size : mid * ENTRY.size + 16])
        if key < root_id:
            lo = mid + 1
        else:
            hi = mid
    if lo < entries:
        rid, seq, line = ENTRY.unpack_from(view, lo * ENTRY.size)
        if rid == root_id:
            return Entry(rid, seq, line)
    return None


def expected_tail(batches: int, last_sha256: str) -> str:
    """The name the top's last file must have for a job row (``batches``, ``last_sha256``)."""
    return tail_name(batches, last_sha256)
