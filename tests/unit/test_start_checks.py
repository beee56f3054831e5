"""Which databases a Celery process checks at start (orbit_tasks/start_checks.py): pure rules."""

from __future__ import annotations

from orbit_tasks.start_checks import (
    CHECKED_ENV,
    beat_chains,
    chains_of_queues,
    checked_marker,
    unchecked,
)


def test_queues_name_the_databases_their_tasks_use() -> None:
    assert chains_of_queues(["orbit.control"]) == ["platform"]
    assert chains_of_queues(["orbit.archive." + "0" * 32]) == ["platform"]
    assert chains_of_queues(["orbit.sender"]) == ["business"]
    assert chains_of_queues(["orbit.sender", "orbit.control"]) == ["platform", "business"]
    assert chains_of_queues(["celery", "orbit.archiver"]) == []  # not ours: nothing to check


def test_chains_checked_by_the_orbit_command_are_not_checked_again() -> None:
    marker = checked_marker(["platform"])
    assert unchecked(["platform", "business"], {CHECKED_ENV: marker}) == ["business"]
    assert unchecked(["platform"], {}) == ["platform"]
    assert unchecked(["business"], {CHECKED_ENV: checked_marker(["platform", "business"])}) == []


def test_beat_checks_the_databases_the_environment_names() -> None:
    assert beat_chains({"ORBIT_DATABASE_URL": "mysql://x"}) == ["platform"]
    assert beat_chains({"ORBIT_SENDER_DATABASE_URL": "mysql://x"}) == ["business"]
    both = {"ORBIT_DATABASE_URL": "a", "ORBIT_SENDER_DATABASE_URL": "b"}
    assert beat_chains(both) == ["platform", "business"]
    assert beat_chains({}) == ["platform", "business"]  # the embedded defaults (the demo)
