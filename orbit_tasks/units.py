"""The operator's vocabulary of values (issue 27, docs/cli.md "One vocabulary"). Pure functions.

One parser per idea, used by every option, argument and environment variable:

* **integers**: ASCII digits only (``0-9``): no sign, no spaces, no other digits (``１０``, a
  fullwidth 10, is refused, where Python's ``int()`` reads it as 10);
* **durations**: ``<digits><s|m|h|d>`` (``30d``, ``90s``), a unit always on the command line (a
  bare ``30`` is refused: seconds or days?); environment variables whose name says the unit
  (``*_SECONDS``) also keep a bare number as seconds (:func:`parse_env_duration`);
* **sizes**: ``<digits><B|KiB|MiB|GiB>`` (``256MiB``, ``17B``), a unit always;
* **reasons** and other free text that is stored and printed: printable text on one line
  (:func:`text_refusal`).

Nothing is stripped: a value with a space in it (``' 10'``, ``'7 d'``) is refused, not guessed.
"""

from __future__ import annotations

import re
import unicodedata

from orbit_tasks.errors import InvalidInput

#: The one rule of digits: ASCII only (``re.ASCII`` keeps ``\d`` from matching ``７``).
DIGITS = "[0-9]"
_INT = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)
_SIZE = re.compile(r"([0-9]+)(B|KiB|MiB|GiB)?", re.ASCII)
_SIZE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_DURATION = re.compile(r"([0-9]+)([smhd])?", re.ASCII)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: More significant digits than any value an option allows: out of range, never parsed
#: (int() of thousands of digits is Python's ValueError, not an answer).
MAX_DURATION_DIGITS = 12
MAX_INT_DIGITS = 18
DURATION_FORMS = "an integer with s, m, h or d, without spaces (e.g. 90s, 15m, 6h, 30d)"
SIZE_FORMS = "an integer with B, KiB, MiB or GiB, without spaces (e.g. 256MiB)"
INTEGER_FORMS = "ASCII digits 0-9 only"


def shown(text: str) -> str:
    """``text`` as a message quotes it: ``repr``, cut when long (a pasted file is not echoed)."""
    return repr(text) if len(text) <= 40 else f"{text[:16]!r}...({len(text)} characters)"


def _capped(digits: str, cap: int) -> int:
    digits = digits.lstrip("0") or "0"
    return 10**cap if len(digits) > cap else int(digits)


# --- integers -----------------------------------------------------------------------------------


def ascii_int(text: str) -> int | None:
    """The integer of ``text`` when it is ASCII digits only, else None. More than
    :data:`MAX_INT_DIGITS` significant digits come out as 10**18: beyond every range."""
    if not _INT.fullmatch(text):
        return None
    return _capped(text, MAX_INT_DIGITS)


def parse_int(text: str | int, what: str, lo: int, hi: int) -> int:
    """``text`` as an integer in ``lo..hi`` (ASCII digits; a leading ``-`` only when ``lo`` < 0),
    or :class:`InvalidInput` naming ``what``, the value and the range."""
    if isinstance(text, int) and not isinstance(text, bool):
        value: int | None = text
    else:
        raw = str(text)
        negative = lo < 0 and raw.startswith("-")
        value = ascii_int(raw[1:] if negative else raw)
        if value is not None and negative:
            value = -value
    # thousands separators for large bounds: 10,000,000 is read at a glance, 10000000 is not
    allowed = f"allowed {lo:,}..{hi:,}" if hi >= 100_000 else f"allowed {lo}..{hi}"
    if value is None:
        raise InvalidInput(
            f"{what} {shown(str(text))} is not an integer ({allowed}; {INTEGER_FORMS})"
        )
    if not lo <= value <= hi:
        raise InvalidInput(f"{what} {value} is out of range ({allowed})")
    return value


def ascii_decimal(text: str) -> float | None:
    """``12`` or ``0.5`` (ASCII digits, one optional point; no sign, exponent or spaces)."""
    if not _DECIMAL.fullmatch(text) or len(text) > 20:
        return None
    return float(text)


# --- durations ----------------------------------------------------------------------------------


def duration_seconds(text: str, *, unit_required: bool = True) -> int | None:
    """Seconds of ``<digits><s|m|h|d>`` (ASCII digits, no spaces; a bare number is seconds only
    when not ``unit_required``), or None when ``text`` is not of that form. Not range-checked:
    more than :data:`MAX_DURATION_DIGITS` significant digits come out beyond every range."""
    m = _DURATION.fullmatch(text)
    if m is None or (unit_required and m.group(2) is None):
        return None
    factor = _DURATION_UNITS[m.group(2)] if m.group(2) else 1
    return _capped(m.group(1), MAX_DURATION_DIGITS) * factor


def duration_refusal(text: str, what: str) -> str:
    """Why ``text`` is not a duration of the command line ("" when it is)."""
    if duration_seconds(text) is not None:
        return ""
    if _INT.fullmatch(text):
        return (
            f"{what} {shown(text)} is not a duration: the number needs a unit (a bare number "
            f"is not read as seconds); use {DURATION_FORMS}"
        )
    return f"{what} {shown(text)} is not a duration; use {DURATION_FORMS}"


def parse_duration(text: str | int, what: str = "duration") -> int:
    """``'30d'`` -> 2592000 seconds: the command line's durations, always with a unit. An ``int``
    (a value from code, already seconds) passes unchanged."""
    if isinstance(text, int):
        return text
    refusal = duration_refusal(text, what)
    if refusal:
        raise InvalidInput(refusal)
    seconds = duration_seconds(text)
    assert seconds is not None
    return seconds


def parse_env_duration(text: str, name: str) -> float:
    """A duration from an environment variable named for its unit (``ORBIT_TICK_SECONDS``):
    a bare number is seconds, as the variable's name and its documentation always said (a
    decimal ``0.5`` too), and the command line's forms (``90s``, ``2m``) are accepted as well.
    ASCII digits, no spaces. Not range-checked."""
    decimal = ascii_decimal(text)
    if decimal is not None:
        return decimal
    seconds = duration_seconds(text)
    if seconds is None:
        raise InvalidInput(
            f"{name}={shown(text)} is not a duration (seconds as a number, e.g. 60 or 0.5, or "
            f"{DURATION_FORMS})"
        )
    return float(seconds)


def format_duration(seconds: int) -> str:
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= factor and seconds % factor == 0:
            return f"{seconds // factor}{unit}"
    return f"{seconds}s"


# --- sizes --------------------------------------------------------------------------------------


def parse_size(text: str | int, what: str = "size") -> int:
    """``'256MiB'`` -> 268435456: B, KiB, MiB or GiB after ASCII digits, always (a bare number
    is refused: bytes or MiB?). An ``int`` (a value from code, already bytes) passes unchanged."""
    if isinstance(text, int):
        return text
    m = _SIZE.fullmatch(text)
    if m is None:
        raise InvalidInput(f"{what} {shown(text)} is not a size; use {SIZE_FORMS}")
    if m.group(2) is None:
        raise InvalidInput(
            f"{what} {shown(text)} is not a size: the number needs a unit (a bare number is "
            f"not read as bytes); use {SIZE_FORMS}"
        )
    return _capped(m.group(1), MAX_INT_DIGITS) * _SIZE_UNITS[m.group(2)]


def format_size(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


# --- text ---------------------------------------------------------------------------------------

_CATEGORY_NAMES = {
    "Cc": "control character",
    "Cf": "format character",
    "Zl": "line separator",
    "Zp": "paragraph separator",
    "Cn": "unassigned code point",
    "Co": "private-use character",
}


def one_line_refusal(text: str, what: str) -> str:
    """Why ``text`` is not printable text on one line ("" when it is): every character must be
    printable (``str.isprintable``) or a space (Unicode Zs). Refused: C0/C1 controls (newline,
    tab, U+0085 NEL), DEL, line and paragraph separators (U+2028, U+2029), format characters
    (bidi overrides), lone surrogates, unassigned code points. The message names the first one
    by its code point and position, never prints it; bytes that were not UTF-8 (the shell hands
    them over as surrogate escapes U+DC80..U+DCFF) are named as such."""
    for index, ch in enumerate(text):
        if ch.isprintable() or unicodedata.category(ch) == "Zs":
            continue
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            return (
                f"{what} is not valid UTF-8: the byte 0x{code - 0xDC00:02X} at position {index}; "
                "allowed: printable text on one line"
            )
        kind = _CATEGORY_NAMES.get(unicodedata.category(ch), "character")
        return (
            f"{what} contains the non-printable character U+{code:04X} at position {index} "
            f"(a {kind}); allowed: printable text on one line"
        )
    return ""


def text_refusal(text: str, what: str, max_chars: int) -> str:
    """The one rule of a reason (``--reason`` of every command; the sender's rule): 1..max_chars
    characters of printable text on one line, not blank. "" when ``text`` keeps it; else one
    line naming the actual problem (the character and its position, the length, blank)."""
    bad = one_line_refusal(text, what)
    if bad:
        return bad
    if not text.strip():
        return f"{what} is blank (allowed 1..{max_chars} characters of printable text, not blank)"
    if len(text) > max_chars:
        return f"{what} is {len(text)} characters (allowed 1..{max_chars}, not blank)"
    return ""


def parse_text(text: str, what: str, max_chars: int) -> str:
    """``text`` when :func:`text_refusal` finds nothing, else :class:`InvalidInput`."""
    refusal = text_refusal(text, what, max_chars)
    if refusal:
        raise InvalidInput(refusal)
    return text
