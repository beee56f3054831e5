"""The one gzip member shape of batch files (SPEC §6, docs/archive-format.md). Pure.

Built here, not by :mod:`gzip`: a fixed 10-byte header (no flags, so no file name; mtime 0;
XFL 0; OS 255) + raw deflate at level 6 + CRC32 + size, so identical input gives identical bytes
with the same zlib, and ``zcat``/``gzip.decompress`` read it. The reader requires FLG 0 and mtime
0, exactly one member and no trailing bytes: a file has one valid spelling.
"""

from __future__ import annotations

import struct
import zlib

GZIP_LEVEL = 6
HEADER = (
    b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # magic, deflate, FLG 0, mtime 0, XFL 0, OS 255
)


class GzipRefused(ValueError):
    """Bytes that are not exactly one gzip member of this shape; the message says why."""


def _need(cond: bool, reason: str) -> None:
    if not cond:
        raise GzipRefused(reason)


def gzip_member(payload: bytes) -> bytes:
    comp = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY)
    body = comp.compress(payload) + comp.flush()
    trailer = struct.pack("<II", zlib.crc32(payload) & 0xFFFFFFFF, len(payload) & 0xFFFFFFFF)
    return HEADER + body + trailer


def gunzip_member(data: bytes) -> bytes:
    """The payload of one member built by :func:`gzip_member`; raises :class:`GzipRefused`."""
    _need(len(data) >= 18 and data[:3] == b"\x1f\x8b\x08", "batch is not gzip (deflate)")
    _need(data[3] == 0, "batch gzip header has flags (file name, comment or extra)")
    _need(data[4:8] == b"\x00\x00\x00\x00", "batch gzip mtime is not 0")
    dec = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        payload = dec.decompress(data[10:]) + dec.flush()
    except zlib.error:
        raise GzipRefused("batch gzip stream is corrupt") from None
    _need(dec.eof, "batch gzip stream is truncated")
    _need(len(dec.unused_data) == 8, "batch gzip has trailing bytes or a bad trailer")
    crc, size = struct.unpack("<II", dec.unused_data)
    _need(crc == zlib.crc32(payload) & 0xFFFFFFFF, "batch gzip CRC mismatch")
    _need(size == len(payload) & 0xFFFFFFFF, "batch gzip size mismatch")
    return payload
