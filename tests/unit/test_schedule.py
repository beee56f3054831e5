"""Pure plan scheduling (SPEC §4) at its exact boundaries."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from orbit_tasks.archive import plans as s
from orbit_tasks.errors import InvalidInput

T0 = dt.datetime(2026, 1, 1, 0, 0, 0)
US = dt.timedelta(microseconds=1)
HOUR = 3600
DAY = 86400
MIB = 1024**2
GIB = 1024**3


def cfg(**kw: object) -> s.PlanConfig:
    base: dict[str, object] = dict(
        kind="tasks", interval_seconds=DAY, batch_size=100, max_bytes=256 * MIB, policy_revision=1
    )
    base.update(kw)
    return s.PlanConfig(**base)  # type: ignore[arg-type]


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [3600, 3601, 2591999, 2592000])
def test_interval_inside_bounds_is_accepted(interval: int) -> None:
    assert s.validate_config(cfg(interval_seconds=interval)).interval_seconds == interval


@pytest.mark.parametrize("interval", [3599, 2592001, 0, -3600])
def test_interval_outside_bounds_names_value_and_range(interval: int) -> None:
    with pytest.raises(InvalidInput) as exc:
        s.validate_config(cfg(interval_seconds=interval))
    assert f"interval_seconds {interval}s" in str(exc.value)
    assert "3600..2592000" in str(exc.value)


@pytest.mark.parametrize("n", [1, 100])
def test_batch_size_bounds_accepted(n: int) -> None:
    assert s.validate_config(cfg(batch_size=n)).batch_size == n


@pytest.mark.parametrize("n", [0, 101])
def test_batch_size_outside_bounds(n: int) -> None:
    with pytest.raises(InvalidInput, match=rf"batch_size {n} is out of range \(allowed 1\.\.100\)"):
        s.validate_config(cfg(batch_size=n))


@pytest.mark.parametrize("n", [MIB, GIB])
def test_max_bytes_bounds_accepted(n: int) -> None:
    assert s.validate_config(cfg(max_bytes=n)).max_bytes == n


@pytest.mark.parametrize("n", [MIB - 1, GIB + 1])
def test_max_bytes_outside_bounds(n: int) -> None:
    with pytest.raises(InvalidInput) as exc:
        s.validate_config(cfg(max_bytes=n))
    assert f"max_bytes {n} " in str(exc.value)
    assert "1048576..1073741824" in str(exc.value) and "1MiB..1GiB" in str(exc.value)


def test_unknown_kind_lists_allowed_kinds() -> None:
    with pytest.raises(InvalidInput, match=r"kind 'task' is not a history kind \(allowed: tasks,"):
        s.validate_config(cfg(kind="task"))
    for kind in ("tasks", "workflows", "events", "audit", "deliveries", "inbox", "idempotency"):
        s.validate_config(cfg(kind=kind))


@pytest.mark.parametrize("rev", [0, -1])
def test_policy_revision_must_be_positive(rev: int) -> None:
    with pytest.raises(InvalidInput, match=rf"policy_revision {rev} is out of range"):
        s.validate_config(cfg(policy_revision=rev))
    assert s.validate_config(cfg(policy_revision=1)).policy_revision == 1


def test_non_integer_values_are_refused() -> None:
    with pytest.raises(InvalidInput, match="not an integer"):
        s.validate_config(cfg(batch_size=True))
    with pytest.raises(InvalidInput, match="not an integer"):
        s.validate_config(cfg(interval_seconds=3600.0))


# --- due ----------------------------------------------------------------------------------------


def test_due_boundary_equality_is_due() -> None:
    assert s.is_due(True, T0, T0) is True
    assert s.is_due(True, T0 + US, T0) is False
    assert s.is_due(True, T0 - US, T0) is True
    assert s.is_due(False, T0 - dt.timedelta(days=9), T0) is False


# --- coalescing ---------------------------------------------------------------------------------


def test_next_after_exactly_due_moves_one_interval() -> None:
    assert s.next_after(T0, HOUR, T0) == T0 + dt.timedelta(hours=1)


def test_next_after_one_microsecond_before_next_slot() -> None:
    now = T0 + dt.timedelta(hours=1) - US
    assert s.next_after(T0, HOUR, now) == T0 + dt.timedelta(hours=1)


def test_next_after_landing_exactly_on_a_slot_skips_it() -> None:
    # now == next_run_at + 3h: the result must be strictly later than now.
    now = T0 + dt.timedelta(hours=3)
    assert s.next_after(T0, HOUR, now) == T0 + dt.timedelta(hours=4)


def test_many_missed_runs_coalesce_into_one_with_phase_kept() -> None:
    next_run = dt.datetime(2026, 1, 1, 3, 17, 5, 123456)
    now = next_run + dt.timedelta(days=400, hours=5, microseconds=7)
    result = s.next_after(next_run, DAY, now)
    assert result > now
    assert result - now <= dt.timedelta(days=1)
    assert (result - next_run) % dt.timedelta(days=1) == dt.timedelta(0)  # phase kept
    assert (result.hour, result.minute, result.second, result.microsecond) == (3, 17, 5, 123456)
    # A second tick at the same moment is no longer due: one run, not 401.
    assert not s.is_due(True, result, now)


def test_next_after_future_value_is_unchanged() -> None:
    assert s.next_after(T0 + US, HOUR, T0) == T0 + US


def test_next_after_with_max_interval() -> None:
    now = T0 + dt.timedelta(seconds=2592000 * 5 + 1)
    assert s.next_after(T0, 2592000, now) == T0 + dt.timedelta(seconds=2592000 * 6)


# --- enable transitions -------------------------------------------------------------------------


def test_first_enable_is_due_now() -> None:
    assert s.next_run_on_change(None, True, None, T0) == T0
    assert s.is_due(True, s.next_run_on_change(None, True, None, T0), T0)


def test_reenable_is_due_now_and_other_changes_keep_schedule() -> None:
    later = T0 + dt.timedelta(days=3)
    assert s.next_run_on_change(False, True, later, T0) == T0
    assert s.next_run_on_change(True, True, later, T0) == later
    assert s.next_run_on_change(True, False, later, T0) == later
    assert s.next_run_on_change(False, False, later, T0) == later


# --- tick decision ------------------------------------------------------------------------------


def decide(**kw: object) -> s.TickAction:
    base: dict[str, object] = dict(
        enabled=True,
        next_run_at=T0,
        now=T0,
        namespace_active=True,
        policy_revision=2,
        latest_policy_revision=2,
        active_job_id=None,
    )
    base.update(kw)
    return s.tick_action(**base)  # type: ignore[arg-type]


def test_tick_action_order() -> None:
    assert decide() is s.TickAction.CREATE_JOB
    assert decide(next_run_at=T0 + US) is s.TickAction.NOT_DUE
    assert decide(enabled=False) is s.TickAction.NOT_DUE
    assert decide(namespace_active=False, latest_policy_revision=3) is (
        s.TickAction.NAMESPACE_INACTIVE
    )
    assert decide(latest_policy_revision=3, active_job_id=b"x" * 16) is (
        s.TickAction.POLICY_UNCONFIRMED
    )
    assert decide(latest_policy_revision=None) is s.TickAction.POLICY_UNCONFIRMED
    assert decide(active_job_id=b"x" * 16) is s.TickAction.COALESCED


# --- orbit plan run: due now, phase kept ---------------------------------------------------------

_US = dt.timedelta(microseconds=1)


@pytest.mark.parametrize(
    "ahead, back",
    [
        (dt.timedelta(0), 0),  # already due: unchanged
        (-dt.timedelta(days=3), 0),  # overdue: unchanged (the tick coalesces)
        (_US, 1),
        (dt.timedelta(hours=5), 1),
        (dt.timedelta(days=1), 1),  # exactly one interval ahead: one back lands on now
        (dt.timedelta(days=1) + _US, 2),  # an interval was shortened: two back
    ],
)
def test_run_now_at_moves_back_whole_intervals_and_the_tick_lands_on_the_phase(
    ahead: dt.timedelta, back: int
) -> None:
    now = dt.datetime(2026, 3, 1, 12, 0, 0, 123456)
    interval = 86400
    scheduled = now + ahead
    due = s.run_now_at(scheduled, interval, now)
    assert due == scheduled - back * dt.timedelta(seconds=interval)
    assert s.is_due(True, due, now)
    after = s.next_after(due, interval, now)  # what the tick that creates the job writes
    assert after > now and (after - scheduled) % dt.timedelta(seconds=interval) == dt.timedelta(0)
    if back:
        assert after == scheduled - (back - 1) * dt.timedelta(seconds=interval)


def test_run_refusal_names_the_first_reason() -> None:
    ok: dict[str, Any] = dict(
        enabled=True, namespace_state="ACTIVE", policy_revision=2, latest_policy_revision=2,
        active_job_id=None,
    )  # fmt: skip

    def refusal(**change: Any) -> str:
        return str(s.run_refusal(**{**ok, **change}) or "")

    assert s.run_refusal(**ok) is None
    assert "not ACTIVE" in refusal(namespace_state="DISABLED")
    assert "disabled" in refusal(enabled=False)
    assert "policy unconfirmed" in refusal(latest_policy_revision=3)
    assert "latest is 3" in refusal(latest_policy_revision=3)
    active = refusal(active_job_id=b"\x01" * 16, active_job_state="FAILED")
    assert "01" * 16 in active and "FAILED" in active
