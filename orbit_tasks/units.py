"""Parsing of operator-facing sizes (``256MiB``) and durations (``30d``). Pure functions."""

from __future__ import annotations

import re
import unicodedata

from orbit_tasks.errors import InvalidInput

_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*$")
_SIZE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, None: 1}
_DURATION = re.compile(r"\s*([0-9]+)\s*([smhd])?\s*")  # ASCII digits: not "７d"
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
#: More significant digits than any duration an option allows: out of range, never parsed
#: (int() of thousands of digits is Python's ValueError, not an answer).
MAX_DURATION_DIGITS = 12


def parse_size(text: str | int, what: str = "size") -> int:
    """``'256MiB'`` -> 268435456. Accepts a bare integer (bytes) or B/KiB/MiB/GiB."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise InvalidInput(f"{what} {text!r} is not a size; use an integer with B, KiB, MiB or GiB")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def duration_seconds(text: str, *, unit_required: bool = False) -> int | None:
    """Seconds of ``<digits>[s|m|h|d]`` (ASCII digits; a bare number is seconds unless
    ``unit_required``), or None when ``text`` is not of that form. Not range-checked: more than
    :data:`MAX_DURATION_DIGITS` significant digits come out beyond every range."""
    m = _DURATION.fullmatch(text)
    if m is None or (unit_required and m.group(2) is None):
        return None
    digits = m.group(1).lstrip("0") or "0"
    if len(digits) > MAX_DURATION_DIGITS:
        return 10**MAX_DURATION_DIGITS * 86400
    return int(digits) * _DURATION_UNITS[m.group(2)]


def parse_duration(text: str | int, what: str = "duration") -> int:
    """``'30d'`` -> 2592000 seconds. Accepts a bare integer (seconds) or s/m/h/d."""
    if isinstance(text, int):
        return text
    seconds = duration_seconds(text)
    if seconds is None:
        raise InvalidInput(f"{what} {text!r} is not a duration; use an integer with s, m, h or d")
    return seconds


def format_size(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


def format_duration(seconds: int) -> str:
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= factor and seconds % factor == 0:
            return f"{seconds // factor}{unit}"
    return f"{seconds}s"


def one_line_refusal(text: str, what: str) -> str:
    """Why ``text`` is not printable text on one line ("" when it is): every character must be
    printable (``str.isprintable``) or a space (Unicode Zs). Refused: C0/C1 controls (newline,
    U+0085 NEL), DEL, line and paragraph separators (U+2028, U+2029), format characters (bidi
    overrides), lone surrogates, unassigned code points. The message names the first one by
    its code point, never prints it."""
    for index, ch in enumerate(text):
        if not (ch.isprintable() or unicodedata.category(ch) == "Zs"):
            return (
                f"{what} contains the non-printable character U+{ord(ch):04X} at position "
                f"{index}; allowed: printable text on one line"
            )
    return ""
