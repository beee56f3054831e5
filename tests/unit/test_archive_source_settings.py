"""``ORBIT_ARCHIVE_SOURCE_URL`` in the settings and the replica rule (issue 16 item 4; pure)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from orbit_tasks.archive.controls import (
    REPLICA_BEAT,
    REPLICA_ERRANT,
    JobView,
    Situation,
    WaitReason,
    first_wait,
    replica_behind,
)
from orbit_tasks.errors import InvalidInput
from orbit_tasks.settings import load_settings

PRIMARY = "mysql+mysqldb://root@db1/orbit"


def test_unset_or_empty_means_the_platform_database() -> None:
    assert load_settings({"ORBIT_DATABASE_URL": PRIMARY}).archive_source_url is None
    env = {"ORBIT_DATABASE_URL": PRIMARY, "ORBIT_ARCHIVE_SOURCE_URL": ""}
    assert load_settings(env).archive_source_url is None


@pytest.mark.parametrize(
    "url", ["mysql://r@db2/orbit", "mysql+mysqldb://r:pw@db2:3307/orbit", "mariadb://r@db2/o"]
)
def test_a_mysql_or_mariadb_replica_is_accepted(url: str) -> None:
    env = {"ORBIT_DATABASE_URL": PRIMARY, "ORBIT_ARCHIVE_SOURCE_URL": url}
    settings = load_settings(env)
    assert settings.archive_source_url == url
    assert "pw" not in repr(settings)  # kept out of repr like the other secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [("sqlite:///var/x.sqlite3", "'sqlite'"), ("postgresql://h/db", "'postgresql'"),
     ("db2:3306/orbit", "none")],
)  # fmt: skip
def test_another_scheme_is_refused_naming_the_variable(url: str, shown: str) -> None:
    env = {"ORBIT_DATABASE_URL": PRIMARY, "ORBIT_ARCHIVE_SOURCE_URL": url}
    with pytest.raises(InvalidInput) as err:
        load_settings(env)
    message = str(err.value)
    assert message.startswith("ORBIT_ARCHIVE_SOURCE_URL has the scheme " + shown)
    assert "allowed: mysql:// or mariadb://" in message


def test_a_replica_of_a_sqlite_platform_database_is_refused() -> None:
    env = {"ORBIT_ARCHIVE_SOURCE_URL": "mysql://r@db2/orbit", "ORBIT_VAR_DIR": "/tmp/x"}
    with pytest.raises(InvalidInput, match="ORBIT_DATABASE_URL is not MySQL/MariaDB"):
        load_settings(env)


def test_replica_behind_until_it_shows_a_beat_at_or_after_the_job() -> None:
    created = datetime(2026, 5, 1, 12, 0, 0, 500)
    assert replica_behind(None, created)
    assert replica_behind(created - timedelta(microseconds=1), created)
    assert not replica_behind(created, created)
    assert not replica_behind(created + timedelta(seconds=5), created)


def test_replica_lag_is_one_of_the_checks_before_a_claim() -> None:
    created = datetime(2026, 5, 1, 12, 0, 0)
    job = JobView(b"s" * 16, b"n" * 16, "tasks", b"j" * 16, created)
    now = created + timedelta(minutes=1)
    assert first_wait(job, Situation(now)) is None  # no replica: no reading, no wait
    behind = Situation(now, extra={REPLICA_BEAT: created - timedelta(seconds=1)})
    assert first_wait(job, behind) is WaitReason.REPLICA_LAG
    assert first_wait(job, Situation(now, extra={REPLICA_BEAT: None})) is WaitReason.REPLICA_LAG
    assert first_wait(job, Situation(now, extra={REPLICA_BEAT: created})) is None


def test_an_errant_replica_waits_replica_diverged_before_its_lag() -> None:
    """Issue 24: a replica with errant GTIDs is no copy of the primary, caught or not."""
    created = datetime(2026, 5, 1, 12, 0, 0)
    job = JobView(b"s" * 16, b"n" * 16, "tasks", b"j" * 16, created)
    now = created + timedelta(minutes=1)
    errant = {REPLICA_ERRANT: ["0-2-7"], REPLICA_BEAT: None}
    assert first_wait(job, Situation(now, extra=errant)) is WaitReason.REPLICA_DIVERGED
    clean = {REPLICA_ERRANT: [], REPLICA_BEAT: created}
    assert first_wait(job, Situation(now, extra=clean)) is None
