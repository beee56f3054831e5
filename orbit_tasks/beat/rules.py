"""Pure rules of the beat leader's lease (issue 30 item 3): how long a lease lasts, how often it
is renewed or watched, and until when a leader may trust it by its own monotonic clock. No I/O.

A standby takes the lease only once the database clock is past ``lease_until``; a leader trusts
its lease until ``renew started + lease - margin`` on its own monotonic clock, measured from
*before* the renewal was sent, so it stops publishing before any standby can take over (two
leaders never publish in the same period, however the renewal's round trip went)."""

from __future__ import annotations

import math
from collections.abc import Iterable

#: The longest lease (a tick period of an hour still hands over within half a minute).
MAX_LEASE_SECONDS = 30
#: The shortest lease the database clock can express (whole seconds in statements).
MIN_LEASE_SECONDS = 1


def lease_seconds(periods: Iterable[float], configured: int | None = None) -> int:
    """The lease: ``configured`` when the operator set one, else three quarters of the shortest
    tick period (so that a standby takes over within one period of the leader's death: a lease
    plus one watch interval, a quarter of it), between 1 and 30 seconds."""
    if configured is not None:
        return configured
    shortest = min(periods, default=60.0)
    return max(MIN_LEASE_SECONDS, min(MAX_LEASE_SECONDS, math.floor(shortest * 0.75)))


def renew_every(lease: int) -> float:
    """A leader renews four times per lease: three renewals may fail before it stands down."""
    return lease / 4


def watch_every(lease: int) -> float:
    """A standby looks at the lease four times per lease."""
    return lease / 4


def trusted_until(sent_at: float, lease: int) -> float:
    """Until when (monotonic) a leader whose renewal was *sent* at ``sent_at`` may publish: the
    lease, less a margin of a tenth (at least 50 ms) for the clocks' rates."""
    return sent_at + lease - max(0.05, lease / 10)
