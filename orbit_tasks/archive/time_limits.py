"""Celery time limits of the archive tasks, derived from the archive lease (pure; SPEC §7).

The hard limit is strictly below the lease, so that a stuck claim dies before another node may
take it over; the soft limit leaves time to release cleanly. With ``margin = clamp(lease // 6,
1, 10)``: lease 120 -> hard 110 / soft 100; lease 6 -> hard 5 / soft 4; lease 4 -> 3 / 2.
"""

from __future__ import annotations


def task_time_limits(lease_seconds: int) -> tuple[int, int]:
    """``(hard, soft)`` time limits in seconds for ``lease_seconds``."""
    margin = max(1, min(10, lease_seconds // 6))
    hard = lease_seconds - margin
    return hard, max(1, hard - margin)
