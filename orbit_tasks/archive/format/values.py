"""The base of the archive format (SPEC §6, docs/archive-format.md): the format names, its two
errors, canonical JSON, values and timestamps, SHA-256, and the strict readers the manifest, the
batches and the table descriptions share. Pure: no I/O, no clock; imports no other format module.

* Every JSON text (manifest, each batch line) is canonical: sorted keys, separators ``,``/``:``,
  raw UTF-8 (``ensure_ascii=False``), one ``\\n``. Decoders re-encode and require the same bytes,
  so a file has exactly one valid spelling.
* Values: bytes -> lowercase hex; datetime -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (naive = UTC,
  aware is converted); str -> itself (JSON columns stay the stored text, numbers stay exact);
  bool -> true/false; int -> integer; None -> null. float, Decimal and anything else raise
  :class:`SourceInvalid` (no DECIMAL/FLOAT columns exist; a float would lose exactness).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Any

from orbit_tasks import timestamps
from orbit_tasks.errors import OrbitError
from orbit_tasks.timestamps import format_ts  # the archive's timestamps are the wire's

FORMAT = "orbit-archive/1"  # batch files (unchanged by format 2) and format-1 manifests
FORMAT_1 = FORMAT
FORMAT_2 = "orbit-archive/2"  # manifests whose source describes the tables (SPEC §6)
MANIFEST_FORMAT = FORMAT_2  # what new jobs write
MANIFEST_FORMATS = (FORMAT_1, FORMAT_2)  # what readers accept

HEX32 = re.compile(r"^[0-9a-f]{32}$")  # namespace, job and storage ids


class SourceInvalid(OrbitError):
    """A source row value cannot be encoded exactly (job error code ``SOURCE_INVALID``)."""


class FormatError(OrbitError):
    """Bytes that are not a valid ``orbit-archive/1`` manifest or batch."""


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


def parse_ts(s: str) -> datetime:
    """Inverse of :func:`format_ts`; returns a naive UTC datetime. Strict: raises FormatError."""
    try:
        return timestamps.parse_ts(s)
    except ValueError as exc:
        raise FormatError(str(exc)) from None


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


def hex_id(value: bytes, what: str) -> str:
    if not isinstance(value, bytes | bytearray) or len(value) != 16:
        raise ValueError(f"{what} must be 16 bytes")
    return bytes(value).hex()


def int_at_least(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} {value!r} must be an integer >= {low}")
    return value


def loads_canonical(raw: bytes, what: str) -> Any:
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


def loads_canonical_text(text: str, what: str) -> Any:
    """:func:`loads_canonical` for one line already decoded from UTF-8 (without its newline)."""
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


def need(cond: bool, reason: str) -> None:
    if not cond:
        raise FormatError(reason)


def is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def is_ts(v: Any) -> bool:
    try:
        parse_ts(v)
    except FormatError:
        return False
    return True
