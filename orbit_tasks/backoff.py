"""The one backoff (issue 26 item 4; dramatiq's ``compute_backoff``): capped exponential, with
full jitter. Pure: each caller passes its own base and cap, and its own random number.
"""

from __future__ import annotations

#: Past this exponent every cap in use is reached; it keeps ``2 ** n`` small.
MAX_EXPONENT = 30


def exponential_cap(attempt: int, *, base: float, cap: float) -> float:
    """``min(cap, base * 2 ** attempt)`` for the 0-based ``attempt`` (a negative one counts as
    0); the exponent stops at :data:`MAX_EXPONENT`."""
    return min(cap, base * 2 ** min(max(0, attempt), MAX_EXPONENT))


def full_jitter(attempt: int, *, base: float, cap: float, rnd: float) -> float:
    """``rnd`` (in [0, 1)) times :func:`exponential_cap`: the pause before the next try."""
    return rnd * exponential_cap(attempt, base=base, cap=cap)
