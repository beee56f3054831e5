"""Names of a job's files (SPEC §6, docs/archive-format.md): ``00000000-<sha256>.json`` for the
manifest and ``<seq:08d>-<sha256>.jsonl.gz`` for batch ``seq``. Pure: no I/O.

Anything else in a job directory (temp files, strays of other shapes) parses to ``None``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_SEQ = 99_999_999
TMP_PREFIX = ".tmp-"  # a durable write's temp file (never a job file)

HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^(\d{8})-([0-9a-f]{64})\.(json|jsonl\.gz)$")


class ParsedName(NamedTuple):
    seq: int
    sha256: str
    is_manifest: bool


def check_sha(sha: str) -> None:
    if not isinstance(sha, str) or not HEX64.match(sha):
        raise ValueError("sha256 must be 64 lowercase hex characters")


def manifest_name(sha: str) -> str:
    check_sha(sha)
    return f"00000000-{sha}.json"


def batch_name(seq: int, sha: str) -> str:
    check_sha(sha)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_SEQ:
        raise ValueError(f"batch seq {seq!r} out of range 1..{MAX_SEQ}")
    return f"{seq:08d}-{sha}.jsonl.gz"


def tail_name(batches: int, last_sha256: str) -> str:
    """Name of the confirmed tail: the manifest when ``batches == 0``, else batch ``batches``."""
    return manifest_name(last_sha256) if batches == 0 else batch_name(batches, last_sha256)


def parse_name(name: str) -> ParsedName | None:
    """``ParsedName`` for a manifest/batch name, ``None`` for anything else (temp files...)."""
    m = _NAME.match(name)
    if not m:
        return None
    seq, sha, ext = int(m.group(1)), m.group(2), m.group(3)
    if seq == 0 and ext == "json":
        return ParsedName(0, sha, True)
    if seq >= 1 and ext == "jsonl.gz":
        return ParsedName(seq, sha, False)
    return None
