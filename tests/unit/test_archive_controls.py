"""The pure rules of the archive controls (orbit_tasks/archive/controls.py): scopes, windows,
the throttle's budget arithmetic, the checks and the wait totals."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from orbit_tasks.archive import controls as c
from orbit_tasks.archive.controls import (
    Control,
    ControlKind,
    JobView,
    Scope,
    Situation,
    WaitReason,
)
from orbit_tasks.errors import InvalidInput

S, N = b"\x01" * 16, b"\x02" * 16
T0 = datetime(2026, 12, 1, 5, 59, 59, 999999)


def test_wait_reasons_are_the_issues_words() -> None:
    """Issue 16's five, and issue 24's ``replica_diverged`` (p0004's CHECK)."""
    assert [r.value for r in WaitReason] == [
        "paused",
        "throttled",
        "db_load",
        "replica_lag",
        "window",
        "replica_diverged",
    ]
    assert max(len(r.value) for r in WaitReason) <= 16  # orbit_archive_job_waits.reason


def test_scope_keys_cover_every_scope_above_a_job() -> None:
    keys = c.scope_keys(S, N, "tasks")
    assert len(keys) == 6 and len(set(keys)) == 6
    assert "*/*/*" in keys and f"{S.hex()}/*/*" in keys and f"*/{N.hex()}/tasks" in keys
    assert f"{S.hex()}/{N.hex()}/tasks" in keys
    assert "*/*/tasks" not in keys  # a kind is always a namespace's
    for key in keys:
        storage, ns, kind = key.split("/")
        scope = Scope(
            None if storage == "*" else S, None if ns == "*" else N, None if kind == "*" else kind
        )
        assert scope.key == key and scope.covers(S, N, "tasks")
    assert not Scope(namespace_id=N, kind="events").covers(S, N, "tasks")
    assert not Scope(storage_id=b"\x03" * 16).covers(S, N, "tasks")


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [("01:00-06:00", 60, 360), ("22:00-02:00", 1320, 120), ("00:00-23:59", 0, 1439)],
)
def test_windows_parse(text: str, start: int, end: int) -> None:
    w = c.parse_window(text)
    assert (w.start, w.end, str(w)) == (start, end, text)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("01:00-01:00", "is empty"),
        ("24:00-01:00", "is invalid"),
        ("01:60-02:00", "is invalid"),
        ("1:00-2:00", "is invalid"),
        ("01:00", "is invalid"),
        ("", "is invalid"),
    ],
)
def test_bad_windows_name_the_value_and_the_range(text: str, what: str) -> None:
    with pytest.raises(InvalidInput) as err:
        c.parse_window(text)
    assert repr(text) in str(err.value) and what in str(err.value)
    assert "HH:MM-HH:MM" in str(err.value)


def test_window_ends_are_exact_and_wrap_midnight() -> None:
    day = c.parse_windows(["01:00-06:00"])
    assert c.in_window(day, T0)  # 05:59:59.999999
    assert not c.in_window(day, T0 + timedelta(microseconds=1))  # 06:00 exactly
    assert c.in_window(day, T0.replace(hour=1, minute=0, second=0, microsecond=0))
    assert not c.in_window(day, T0.replace(hour=0, minute=59))
    night = c.parse_windows(["22:00-02:00"])
    assert c.in_window(night, T0.replace(hour=23))
    assert c.in_window(night, T0.replace(hour=1, minute=59, second=59))
    assert not c.in_window(night, T0.replace(hour=2, minute=0, second=0, microsecond=0))
    both = c.parse_windows(["22:00-02:00", "12:00-13:00"])
    assert c.in_window(both, T0.replace(hour=12, minute=30))
    assert c.stored_windows(c.format_windows(both)) == both
    with pytest.raises(InvalidInput, match="no window given"):
        c.parse_windows([])
    with pytest.raises(InvalidInput, match="allowed 1..16"):
        c.parse_windows(["01:00-02:00"] * 17)


@pytest.mark.parametrize("raw", ["0", "-1", "10000001", "2.5", "x", ""])
def test_bad_rates_name_the_allowed_range(raw: str) -> None:
    with pytest.raises(InvalidInput) as err:
        c.validate_rate(raw)
    assert "1..10,000,000" in str(err.value)


def test_budget_charges_roots_over_rate_and_saves_nothing_up() -> None:
    now = T0
    new, wait = c.take_budget(None, now, 100, 200)  # never taken: go at once
    assert (new, wait) == (now + timedelta(seconds=0.5), 0.0)
    new2, wait2 = c.take_budget(new, now, 100, 200)  # a second taker waits its turn
    assert (new2, wait2) == (now + timedelta(seconds=1), 0.5)
    idle = now - timedelta(hours=1)  # idle for an hour: no burst
    assert c.take_budget(idle, now, 100, 200) == (now + timedelta(seconds=0.5), 0.0)
    assert c.budget_wait(new2, now) == 1.0 and c.budget_wait(idle, now) == 0.0


def test_budget_rate_over_many_takers_is_the_rate() -> None:
    """Takers who wait their turn confirm at most rate x span + one file each."""
    rate, roots, now, ready = 100, 10, T0, None
    confirmed_at = []
    for _ in range(300):  # three takers in turn, each sleeping its wait
        ready, wait = c.take_budget(ready, now, roots, rate)
        now += timedelta(seconds=wait)
        confirmed_at.append(now)
    span = (confirmed_at[-1] - confirmed_at[0]).total_seconds()
    assert (len(confirmed_at) - 1) * roots / span == pytest.approx(rate)


def _ctl(kind: ControlKind, **kw: object) -> Control:
    return Control(kind, Scope(storage_id=S), "op", T0, **kw)  # type: ignore[arg-type]


def test_checks_in_order_first_reason_wins() -> None:
    job = JobView(S, N, "tasks")
    assert c.first_wait(job, Situation(now=T0)) is None
    window = _ctl(ControlKind.WINDOW, windows=c.parse_windows(["01:00-06:00"]))
    assert c.first_wait(job, Situation(now=T0, controls=(window,))) is None
    later = T0 + timedelta(microseconds=1)
    assert c.first_wait(job, Situation(now=later, controls=(window,))) is WaitReason.WINDOW
    pause = _ctl(ControlKind.PAUSE, reason="r")
    both = Situation(now=later, controls=(window, pause))
    assert c.first_wait(job, both) is WaitReason.PAUSED
    load = Situation(now=T0, threads_running=5, max_threads_running=4)
    assert c.first_wait(job, load) is WaitReason.DB_LOAD
    assert c.first_wait(job, Situation(now=T0, threads_running=4, max_threads_running=4)) is None
    assert c.first_wait(job, Situation(now=T0, threads_running=99)) is None  # no guard
    assert c.first_wait(job, Situation(now=T0, throttle_wait=0.2)) is WaitReason.THROTTLED
    # a window of a storage and one of a namespace: inside both, or wait
    other = Control(
        ControlKind.WINDOW,
        Scope(namespace_id=N),
        "op",
        T0,
        windows=c.parse_windows(["05:00-05:30"]),
    )
    assert c.first_wait(job, Situation(now=T0, controls=(window, other))) is WaitReason.WINDOW
    # a check added later (replica_lag) is one more function
    lag: c.Check = lambda j, s: WaitReason.REPLICA_LAG if s.extra.get("lagging") else None  # noqa: E731
    checks = [*c.CHECKS, lag]
    assert c.first_wait(job, Situation(now=T0, extra={"lagging": True}), checks) is (
        WaitReason.REPLICA_LAG
    )


def test_in_force_picks_the_covering_controls() -> None:
    mine = _ctl(ControlKind.PAUSE)
    theirs = Control(ControlKind.PAUSE, Scope(storage_id=b"\x09" * 16), "op", T0)
    assert c.in_force([mine, theirs], S, N, "tasks") == [mine]


def test_wait_totals_count_an_open_wait_only_while_pending() -> None:
    since = T0 - timedelta(seconds=10)
    rows = [("paused", since, 2_500_000), ("window", None, 1_000_000)]
    open_ = c.wait_totals(rows, T0, open_counts=True)
    assert open_.seconds[WaitReason.PAUSED] == pytest.approx(12.5)
    assert open_.seconds[WaitReason.WINDOW] == 1.0
    assert (open_.waiting, open_.waiting_since) == (WaitReason.PAUSED, since)
    closed = c.wait_totals(rows, T0, open_counts=False)
    assert closed.seconds[WaitReason.PAUSED] == 2.5 and closed.waiting is None
    assert c.roots_per_second(100, 0) is None and c.roots_per_second(100, 4) == 25
