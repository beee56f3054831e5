"""Celery time limits of the archive tasks and the longest time slice, derived from the archive
lease (pure; SPEC §7; a leaf the settings import, like ``sender_limits``).

The hard limit is strictly below the lease, so that a stuck claim dies before another node may
take it over; the soft limit leaves time to release cleanly. With ``margin = clamp(lease // 6,
1, 10)``: lease 120 -> hard 110 / soft 100; lease 6 -> hard 5 / soft 4; lease 4 -> 3 / 2.

A claim stops at a batch boundary once its time slice is spent: after the slice it still writes
and confirms the batch in hand (and releases), so the slice must end one margin before the soft
limit: ``slice <= soft - margin`` (lease 4 -> 1 s, lease 6 -> 3 s, lease 120 -> 90 s). A longer
slice would let the soft limit kill the claim and the job wait for its lease (issue 16 item 8).
"""

from __future__ import annotations


def _margin(lease_seconds: int) -> int:
    return max(1, min(10, lease_seconds // 6))


def task_time_limits(lease_seconds: int) -> tuple[int, int]:
    """``(hard, soft)`` time limits in seconds for ``lease_seconds``."""
    hard = lease_seconds - _margin(lease_seconds)
    return hard, max(1, hard - _margin(lease_seconds))


def max_slice_seconds(lease_seconds: int) -> int:
    """The longest time slice a claim may run under ``lease_seconds`` (at least 1 s)."""
    return max(1, task_time_limits(lease_seconds)[1] - _margin(lease_seconds))
