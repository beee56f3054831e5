"""``orbit flower``'s pure decisions (SPEC §12 "Flower"): auth required unless --no-auth on
loopback, credentials validated without echoing a password, task history sized for a day."""

from __future__ import annotations

import pytest

from orbit_tasks.errors import InvalidInput
from orbit_tasks.flower_options import is_loopback, require_auth, task_history_size
from orbit_tasks.settings import load_settings


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.5.6.7", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.1.2.3", False)],
)  # fmt: skip
def test_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_auth_rules() -> None:
    assert require_auth("0.0.0.0", False, 1) is True
    assert require_auth("127.0.0.1", True, 0) is False
    assert require_auth("::1", True, 2) is False  # --no-auth wins on loopback
    with pytest.raises(InvalidInput, match="ORBIT_FLOWER_BASIC_AUTH is not set"):
        require_auth("127.0.0.1", False, 0)
    with pytest.raises(InvalidInput, match="--no-auth is refused with --address 0.0.0.0"):
        require_auth("0.0.0.0", True, 1)
    with pytest.raises(InvalidInput, match="not an IP address"):
        require_auth("flower.example", True, 0)


def test_basic_auth_setting_never_echoes_a_password() -> None:
    s = load_settings({"ORBIT_FLOWER_BASIC_AUTH": "ops:correct-horse, audit:battery:staple"})
    assert s.flower_basic_auth == ("ops:correct-horse", "audit:battery:staple")
    assert "correct-horse" not in repr(s)
    assert load_settings({}).flower_basic_auth == ()
    for raw, fragment in [
        ("ops:short", "entry 1 (user 'ops'): password length 5"),
        ("ops:correct-horse,nopassword", "entry 2 is not user:password"),
        (":correct-horse", "entry 1 is not user:password"),
        ("ops:short-😀-password", "entry 1 (user 'ops'): the password must be printable ASCII"),
        ("ops:with space inside", "entry 1 (user 'ops'): the password must be printable ASCII"),
    ]:
        with pytest.raises(InvalidInput) as err:
            load_settings({"ORBIT_FLOWER_BASIC_AUTH": raw})
        assert fragment in str(err.value)
        for secret in ("short", "correct-horse", "😀", "space"):
            assert secret not in str(err.value)


def test_history_holds_a_day_of_ticks_and_archive_tasks() -> None:
    # 2 s sender ticks: 43,200 ticks + up to 43,200 relay wake-ups; 60 s archive ticks: 1,440
    assert task_history_size(2, 60) == 140_000
    assert task_history_size(2, 60, 0) == 90_000
    assert task_history_size(1, 60) >= 2 * 86_400 + 1_440 + 50_000
    assert task_history_size(3600, 3600) == 60_000
    with pytest.raises(ValueError):
        task_history_size(0, 60)


def _day_of_tasks(sender_tick: int, archive_tick: int, archive_tasks: int) -> list[tuple[str, str]]:
    """(uuid, task name) in the order one day sends them: an archive task first, then sender
    ticks each with a relay, archive ticks, and the rest of the archive tasks spread over it."""
    import uuid

    day: list[tuple[float, str]] = [(0.0, "orbit.archive.run_job")]
    day += [(t + 0.1, "orbit.sender.tick") for t in range(0, 86_400, sender_tick)]
    day += [(t + 0.2, "orbit.sender.relay") for t in range(0, 86_400, sender_tick)]
    day += [(t + 0.3, "orbit.archive.tick") for t in range(0, 86_400, archive_tick)]
    step = 86_400 / archive_tasks
    day += [(1 + i * step, "orbit.archive.run_job") for i in range(archive_tasks - 1)]
    return [(str(uuid.uuid4()), name) for _, name in sorted(day)]


@pytest.mark.parametrize("slack", [0, -1])
def test_history_size_keeps_the_days_first_archive_task_in_celerys_lru(slack: int) -> None:
    """Celery's events State (Flower's task store, an LRU) sized by task_history_size still
    holds the first archive task of a day after a whole day of ticks; one slot less than the
    day's tasks drops it (so the check can fail)."""
    from celery.events.state import State

    sender_tick, archive_tick, archive_tasks = 60, 600, 1_000
    day = _day_of_tasks(sender_tick, archive_tick, archive_tasks)
    size = task_history_size(sender_tick, archive_tick, archive_tasks)
    assert size >= len(day)
    state = State(max_tasks_in_memory=size if slack == 0 else len(day) + slack)
    for clock, (task_id, name) in enumerate(day):
        for kind in ("task-received", "task-started", "task-succeeded"):
            state.event(
                {"type": kind, "uuid": task_id, "name": name, "hostname": "w@h",
                 "timestamp": float(clock), "clock": clock, "local_received": float(clock)}
            )  # fmt: skip
    first_archive_task = day[0][0]
    assert (first_archive_task in state.tasks) is (slack == 0)
