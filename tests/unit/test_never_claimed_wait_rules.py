"""Pure rules of the waits the tick records for jobs no worker asked about (issue 27): since
when a pause or a closed window holds a job, and the setting of the forgotten-pause alert."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from orbit_tasks.archive.controls import (
    Control,
    ControlKind,
    Scope,
    WaitReason,
    held_since,
    never_claimed_wait_start,
    parse_windows,
    window_closed_since,
)
from orbit_tasks.errors import InvalidInput
from orbit_tasks.settings import load_settings

DAY = datetime(2026, 12, 3)


def _at(hh: int, mm: int, ss: int = 0, us: int = 0, day: int = 0) -> datetime:
    return DAY + timedelta(days=day, hours=hh, minutes=mm, seconds=ss, microseconds=us)


def test_a_window_closed_at_its_latest_end_at_or_before_now() -> None:
    w = parse_windows(["01:00-06:00"])
    assert window_closed_since(w, _at(3, 0)) is None  # inside
    assert window_closed_since(w, _at(6, 0)) == _at(6, 0)  # [start, end): closed at the end
    assert window_closed_since(w, _at(23, 59)) == _at(6, 0)
    assert window_closed_since(w, _at(0, 30)) == _at(6, 0, day=-1)  # before today's start
    wraps = parse_windows(["22:00-02:00"])
    assert window_closed_since(wraps, _at(2, 0, 0, 1)) == _at(2, 0)
    assert window_closed_since(wraps, _at(21, 0)) == _at(2, 0)
    two = parse_windows(["01:00-02:00", "04:00-05:00"])
    assert window_closed_since(two, _at(3, 0)) == _at(2, 0)
    assert window_closed_since(two, _at(6, 0)) == _at(5, 0)


def _control(kind: ControlKind, since: datetime, windows: str = "") -> Control:
    return Control(
        kind=kind,
        scope=Scope(),
        actor="op",
        since=since,
        windows=parse_windows([windows]) if windows else (),
    )


def test_held_since_the_earliest_pause_or_closed_window() -> None:
    now = _at(12, 0)
    pauses = [_control(ControlKind.PAUSE, _at(9, 0)), _control(ControlKind.PAUSE, _at(8, 0))]
    assert held_since(pauses, WaitReason.PAUSED, now) == _at(8, 0)
    windows = [
        _control(ControlKind.WINDOW, _at(0, 0, day=-5), "01:00-06:00"),
        _control(ControlKind.WINDOW, _at(0, 0, day=-5), "07:00-11:00"),
        _control(ControlKind.WINDOW, _at(0, 0, day=-5), "11:30-13:00"),  # open: holds nothing
    ]
    assert held_since(windows, WaitReason.WINDOW, now) == _at(6, 0)
    assert held_since(windows, WaitReason.PAUSED, now) is None
    assert held_since(pauses, WaitReason.THROTTLED, now) is None


def test_a_never_claimed_wait_starts_at_the_later_of_pending_and_held_never_after_now() -> None:
    now = _at(12, 0)
    assert never_claimed_wait_start(_at(10, 0), _at(8, 0), now) == _at(10, 0)  # created later
    assert never_claimed_wait_start(_at(7, 0), _at(8, 0), now) == _at(8, 0)  # paused later
    assert never_claimed_wait_start(_at(7, 0), None, now) == _at(7, 0)
    assert never_claimed_wait_start(_at(13, 0), None, now) == now  # a clock ahead: never later


def test_the_pause_alert_age_is_a_duration_with_its_unit() -> None:
    def age(raw: str | None) -> int:
        env = {} if raw is None else {"ORBIT_ARCHIVE_PAUSE_ALERT_AFTER": raw}
        return load_settings(env).archive_pause_alert_after_seconds

    assert (age(None), age(""), age("3d"), age("90m")) == (86400, 86400, 3 * 86400, 5400)
    for bad, words in (
        ("86400", "not a duration"),  # a bare number is not read as seconds
        ("１d", "not a duration"),  # ASCII digits only
        ("30s", "out of range"),
        ("366d", "out of range"),
    ):
        with pytest.raises(InvalidInput) as err:
            load_settings({"ORBIT_ARCHIVE_PAUSE_ALERT_AFTER": bad})
        assert words in str(err.value) and "ORBIT_ARCHIVE_PAUSE_ALERT_AFTER" in str(err.value)
        assert "1m..365d" in str(err.value)
