"""The session bounds (orbit_tasks/db/session_bounds.py): pure rules, rendered for MariaDB and,
offline, for MySQL 8 (no MySQL 8 server runs here)."""

from __future__ import annotations

import pytest

from orbit_tasks.archive_limits import task_time_limits
from orbit_tasks.db.session_bounds import (
    bounds_for_lease,
    connect_args,
    server_of,
    session_statement,
    unmet,
)
from orbit_tasks.sender_limits import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS, pass_limits


@pytest.mark.parametrize(
    ("lease", "idle", "lock", "connect", "io"),
    [
        (4, 1, 1, 1, 2),
        (8, 2, 1, 2, 4),
        (40, 10, 5, 10, 20),
        (120, 30, 5, 10, 60),
        (86400, 30, 5, 10, 60),
    ],
)
def test_bounds_of_a_lease(lease: int, idle: int, lock: int, connect: int, io: int) -> None:
    b = bounds_for_lease(lease)
    assert (b.idle_transaction_seconds, b.lock_wait_seconds, b.connect_seconds, b.io_seconds) == (
        idle, lock, connect, io,
    )  # fmt: skip


def _archive_soft_limit(lease: int) -> int:
    return task_time_limits(lease)[1]


@pytest.mark.parametrize("lease", [4, 5, 6, 7, 8, 9, 12, 30, 60, 120, 600, 86400])
def test_archive_bounds_end_before_the_lease_and_the_soft_limit(lease: int) -> None:
    b = bounds_for_lease(lease)
    assert b.idle_transaction_seconds < lease  # a silent holder is rolled back in time
    assert b.lock_wait_seconds < _archive_soft_limit(lease)  # a claim gives up, never killed
    assert b.io_seconds is not None and b.lock_wait_seconds < b.io_seconds < lease
    assert b.sqlite_busy_seconds < _archive_soft_limit(lease)


@pytest.mark.parametrize("lease", [*range(MIN_LEASE_SECONDS, 120), 600, MAX_LEASE_SECONDS])
def test_sender_bounds_end_before_the_lease_and_the_soft_limit(lease: int) -> None:
    b = bounds_for_lease(lease)
    limits = pass_limits(lease)
    assert b.idle_transaction_seconds < lease
    assert b.lock_wait_seconds < limits.soft_limit_seconds


def test_mariadb_gets_the_transaction_bound_and_mysql8_the_session_bound() -> None:
    b = bounds_for_lease(8)
    assert session_statement(b, "mariadb") == (
        "SET SESSION time_zone = '+00:00', innodb_lock_wait_timeout = 1, "
        "idle_transaction_timeout = 2"
    )
    # MySQL 8 has no transaction-only idle bound: wait_timeout closes any session idle that long
    # (the pool's pre-ping replaces it on the next checkout).
    assert session_statement(b, "mysql") == (
        "SET SESSION time_zone = '+00:00', innodb_lock_wait_timeout = 1, wait_timeout = 2"
    )
    assert session_statement(None, "mysql") == "SET SESSION time_zone = '+00:00'"


def test_server_of_the_version_string() -> None:
    assert server_of("10.11.19-MariaDB-0+deb12u1") == "mariadb"
    assert server_of("8.0.36") == "mysql"
    assert server_of("5.5.5-10.6.12-MariaDB-log") == "mariadb"


def test_client_timeouts() -> None:
    b = bounds_for_lease(120)
    assert connect_args(b) == {"connect_timeout": 10, "read_timeout": 60, "write_timeout": 60}
    assert connect_args(b.without_io_bound()) == {"connect_timeout": 10}  # db upgrade
    assert connect_args(None) == {}


def test_unmet_names_missing_unbounded_and_too_large_values() -> None:
    b = bounds_for_lease(8)
    ok = {"innodb_lock_wait_timeout": 1, "idle_transaction_timeout": 2}
    assert unmet(b, "mariadb", ok) == []
    assert unmet(b, "mariadb", {**ok, "innodb_lock_wait_timeout": 50}) == [
        ("innodb_lock_wait_timeout", 50, 1)
    ]
    assert unmet(b, "mariadb", {**ok, "idle_transaction_timeout": 0}) == [
        ("idle_transaction_timeout", 0, 2)
    ]
    assert unmet(b, "mysql", {"innodb_lock_wait_timeout": 1}) == [("wait_timeout", None, 2)]


def test_a_lease_below_one_second_is_refused() -> None:
    with pytest.raises(ValueError, match="allowed >= 1"):
        bounds_for_lease(0)
