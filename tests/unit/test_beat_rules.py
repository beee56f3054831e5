"""The beat leader's lease rules (issue 30 item 3): pure arithmetic."""

from __future__ import annotations

import pytest

from orbit_tasks.beat import rules


@pytest.mark.parametrize(
    ("periods", "configured", "lease"),
    [
        ([60.0, 2.0], None, 1),  # the sender's 2 s tick: 1.5 s, whole seconds, at least 1
        ([60.0], None, 30),  # capped: a 60 s tick hands over within 30 s + a watch
        ([4.0], None, 3),
        ([10.0, 3600.0], None, 7),
        ([], None, 30),
        ([2.0], 5, 5),  # the operator's ORBIT_BEAT_LEASE_SECONDS wins
    ],
)
def test_lease_is_three_quarters_of_the_shortest_period(
    periods: list[float], configured: int | None, lease: int
) -> None:
    assert rules.lease_seconds(periods, configured) == lease


@pytest.mark.parametrize("period", [1.4, 2.0, 4.0, 10.0, 40.0])
def test_a_standby_takes_over_within_one_period(period: float) -> None:
    """Death at the worst moment: right after a renewal; the lease runs out, the standby looks
    at most one watch interval later (plus whole-second rounding of a 1 s floor)."""
    lease = rules.lease_seconds([period])
    worst = lease + rules.watch_every(lease)
    assert worst <= max(period, 1.25)


def test_a_leader_stops_before_its_lease_ends() -> None:
    assert rules.trusted_until(100.0, 3) == pytest.approx(102.7)
    assert rules.trusted_until(100.0, 1) == pytest.approx(100.9)
    assert rules.trusted_until(0.0, 30) == pytest.approx(27.0)
