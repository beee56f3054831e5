"""The time limits of a relay pass derived from the lease (orbit_tasks/sender_limits.py), over
the whole allowed range: a pass always ends on its own before Celery's soft limit."""

from __future__ import annotations

import pytest

from orbit_tasks import sender_limits as limits
from orbit_tasks.errors import InvalidInput
from orbit_tasks.sender_limits import pass_limits
from orbit_tasks.settings import load_settings

LEASES = range(limits.MIN_LEASE_SECONDS, limits.MAX_LEASE_SECONDS + 1)


def _check(lim: limits.PassLimits) -> None:
    m = limits.margin_seconds(lim.lease_seconds)
    assert m >= 0.5
    # the hard limit is below the lease, the soft limit below the hard one, with room between
    eps = 1e-9  # float arithmetic
    assert lim.hard_limit_seconds <= lim.lease_seconds - m + eps
    assert lim.soft_limit_seconds <= lim.hard_limit_seconds - m + eps
    # the last HTTP exchange ends by pass_seconds; m is left for the last outcome writes
    assert lim.pass_seconds == pytest.approx(lim.claim_seconds + 2 * lim.http_seconds)
    assert lim.pass_seconds <= lim.soft_limit_seconds - m + eps
    # a row claimed at the end of the claim budget still fits an identity refresh and a send
    assert lim.claim_seconds + 2 * lim.http_seconds <= lim.pass_seconds + 1e-9
    assert 0 < lim.claim_seconds <= limits.MAX_CLAIM_SECONDS
    assert lim.claim_seconds >= 2 * lim.http_seconds - 1e-9 or lim.claim_seconds == 20.0
    assert lim.http_seconds >= limits.MIN_HTTP_SECONDS
    # and the lease itself leaves time for one bounded send after a claim
    assert 2 * lim.http_seconds < lim.lease_seconds


@pytest.mark.parametrize("lease", [5, 6, 9, 12, 60, 3600])
def test_examples(lease: int) -> None:
    _check(pass_limits(lease))


def test_every_allowed_lease_with_the_default_http_bound() -> None:
    for lease in LEASES:
        _check(pass_limits(lease))


def test_every_allowed_lease_with_every_allowed_http_bound() -> None:
    for lease in LEASES:
        top = limits.max_http_seconds(lease)
        for http in (limits.MIN_HTTP_SECONDS, top / 3, top / 2, top):
            _check(pass_limits(lease, http))


def test_the_issue_case_lease_9() -> None:
    """Before: soft limit 3 s = pass budget 3 s = HTTP timeout 3 s."""
    lim = pass_limits(9)
    assert lim.http_seconds < lim.claim_seconds < lim.pass_seconds < lim.soft_limit_seconds
    assert (lim.soft_limit_seconds, lim.hard_limit_seconds) == (7.5, 8.25)


def test_a_long_lease_does_not_let_a_stuck_pass_run_for_an_hour() -> None:
    lim = pass_limits(3600)
    assert (lim.pass_seconds, lim.soft_limit_seconds, lim.hard_limit_seconds) == (40.0, 50.0, 55.0)


def test_default_lease_keeps_the_ten_second_http_bound() -> None:
    lim = pass_limits(60)
    assert (lim.http_seconds, lim.claim_seconds, lim.pass_seconds) == (10.0, 20.0, 40.0)
    assert (lim.soft_limit_seconds, lim.hard_limit_seconds) == (50.0, 55.0)


@pytest.mark.parametrize(
    ("lease", "http"), [(4, None), (3601, None), (5, 0.05), (5, 0.9), (60, 11.3)]
)
def test_out_of_range_is_refused(lease: int, http: float | None) -> None:
    with pytest.raises(ValueError, match="out of range"):
        pass_limits(lease, http)


def test_settings_refuse_an_http_timeout_the_lease_cannot_hold() -> None:
    env = {"ORBIT_SENDER_LEASE_SECONDS": "9", "ORBIT_SENDER_HTTP_TIMEOUT_SECONDS": "3"}
    with pytest.raises(InvalidInput) as info:
        load_settings(env)
    message = str(info.value)
    assert "ORBIT_SENDER_HTTP_TIMEOUT_SECONDS=3.0" in message
    assert "allowed 0.1..1.6875" in message and "ORBIT_SENDER_LEASE_SECONDS=9" in message
    ok = load_settings({"ORBIT_SENDER_LEASE_SECONDS": "9"})
    assert ok.sender_http_timeout_seconds == limits.default_http_seconds(9)
    assert load_settings({}).sender_http_timeout_seconds == 10.0
