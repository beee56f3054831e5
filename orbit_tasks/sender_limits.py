"""Time limits of one relay pass, derived from the sender lease (pure; docs/sender.md "Time
limits of a pass").

A pass must always end on its own before Celery's soft time limit, and the hard limit stays below
the lease (SPEC §7). With ``m = clamp(lease / 12, 0.5 s, 5 s)`` and ``room = lease - 3 m``::

    claim budget = min(20 s, room - 2 * http bound)
    pass bound   = claim budget + 2 * http bound          (<= room)
    soft limit   = min(lease - 2 m, pass bound + 2 m)     (>= pass bound + m: m for the last
                                                           DB writes)
    hard limit   = soft limit + m                         (<= lease - m: below the lease)

so a stuck pass is stopped soon after the point where a healthy one has ended, also with a long
lease.

The pass claims only during the claim budget; a claimed row starts an HTTP exchange only while
that exchange (bounded in total by the http bound, plus one identity refresh when that is due)
ends by the pass bound, otherwise it is released unsent. So the last exchange ends by the pass
bound, the last outcome write inside ``m`` after it, and the pass before the soft limit. The
http bound may be at most ``room / 4`` (so the claim budget is at least half the room); its
default is ``min(10 s, room / 4)``.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_LEASE_SECONDS = 5
# Retention of outbox rows (``orbit sender prune --older-than``, ``ORBIT_SENDER_RETENTION``;
# docs/sender.md "Retention"): 1 s .. 3650 d.
MIN_RETENTION_SECONDS = 1
MAX_RETENTION_SECONDS = 3650 * 86400
RETENTION_RANGE = "1s..3650d"
MAX_LEASE_SECONDS = 3600
MIN_HTTP_SECONDS = 0.1
MAX_DEFAULT_HTTP_SECONDS = 10.0
MAX_CLAIM_SECONDS = 20.0


@dataclass(frozen=True)
class PassLimits:
    lease_seconds: int
    http_seconds: float  # total bound of one HTTP exchange (identity GET or task POST)
    claim_seconds: float  # no claim after this long into the pass
    pass_seconds: float  # no HTTP exchange runs past this point of the pass
    soft_limit_seconds: float  # Celery soft time limit of orbit.sender.tick / .relay
    hard_limit_seconds: float  # Celery hard time limit, below the lease


def margin_seconds(lease_seconds: float) -> float:
    return min(5.0, max(0.5, lease_seconds / 12))


def _room(lease_seconds: float) -> float:
    return lease_seconds - 3 * margin_seconds(lease_seconds)


def max_http_seconds(lease_seconds: float) -> float:
    """The largest HTTP bound a lease allows (the claim budget keeps at least half the room)."""
    return _room(lease_seconds) / 4


def default_http_seconds(lease_seconds: float) -> float:
    return min(MAX_DEFAULT_HTTP_SECONDS, max_http_seconds(lease_seconds))


def pass_limits(lease_seconds: int, http_seconds: float | None = None) -> PassLimits:
    """The limits of a pass for ``lease_seconds`` (and a configured HTTP bound, if any).
    Raises ``ValueError`` for values outside the ranges the settings allow."""
    if not MIN_LEASE_SECONDS <= lease_seconds <= MAX_LEASE_SECONDS:
        raise ValueError(
            f"lease {lease_seconds} s is out of range "
            f"(allowed {MIN_LEASE_SECONDS}..{MAX_LEASE_SECONDS})"
        )
    http = default_http_seconds(lease_seconds) if http_seconds is None else http_seconds
    top = max_http_seconds(lease_seconds)
    if not MIN_HTTP_SECONDS <= http <= top:
        raise ValueError(
            f"HTTP bound {http} s is out of range for a {lease_seconds} s lease "
            f"(allowed {MIN_HTTP_SECONDS}..{top:g})"
        )
    m = margin_seconds(lease_seconds)
    claim = min(MAX_CLAIM_SECONDS, _room(lease_seconds) - 2 * http)
    pass_seconds = claim + 2 * http
    soft = min(lease_seconds - 2 * m, pass_seconds + 2 * m)
    return PassLimits(
        lease_seconds=lease_seconds,
        http_seconds=http,
        claim_seconds=claim,
        pass_seconds=pass_seconds,
        soft_limit_seconds=soft,
        hard_limit_seconds=soft + m,
    )
