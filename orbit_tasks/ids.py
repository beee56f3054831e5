"""Identifiers: 16 bytes in the platform database, 32 lowercase hex characters for people/files.

New ids are UUIDv7 (48-bit Unix milliseconds, then random bits), so time-ordered inserts stay
close to primary-key order.
"""

from __future__ import annotations

import os
import re
import time

from orbit_tasks.errors import InvalidInput

_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")


def uuid7_bytes(unix_ms: int | None = None) -> bytes:
    """Return a new UUIDv7 as 16 bytes (RFC 9562 layout)."""
    ms = int(time.time() * 1000) if unix_ms is None else unix_ms
    if not 0 <= ms < 1 << 48:
        raise InvalidInput(f"unix_ms {ms} out of range 0..2^48-1")
    rand = bytearray(os.urandom(10))
    rand[0] = 0x70 | (rand[0] & 0x0F)  # version 7 in the high nibble of byte 6
    rand[2] = 0x80 | (rand[2] & 0x3F)  # RFC 4122 variant in byte 8
    return ms.to_bytes(6, "big") + bytes(rand)


def new_id() -> bytes:
    """A fresh platform id (UUIDv7, 16 bytes)."""
    return uuid7_bytes()


def random_id() -> bytes:
    """16 random bytes (lease ids: unguessable, no time order needed)."""
    return os.urandom(16)


def to_hex(value: bytes) -> str:
    if len(value) != 16:
        raise InvalidInput(f"id must be 16 bytes, got {len(value)}")
    return value.hex()


def from_hex(text: str, what: str = "id") -> bytes:
    """Parse a 32-character hex id (case-insensitive) into 16 bytes."""
    if not isinstance(text, str) or not _HEX32.match(text):
        raise InvalidInput(f"{what} {text!r} is not 32 hexadecimal characters")
    return bytes.fromhex(text)


def is_hex_id(text: str) -> bool:
    return bool(_HEX32.match(text))
