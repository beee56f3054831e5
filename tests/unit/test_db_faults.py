"""Transient vs real database errors (pure classification of driver error numbers)."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DisconnectionError, IntegrityError, OperationalError

from orbit_tasks.db.faults import driver_code, is_transient_db


class _DriverError(Exception):
    pass


def _op(*args: object) -> OperationalError:
    return OperationalError("stmt", {}, _DriverError(*args))


@pytest.mark.parametrize("code", [1205, 1213, 1927, 2002, 2003, 2006, 2013, 4031, 1040])
def test_connection_loss_deadlock_and_lock_wait_are_transient(code: int) -> None:
    assert is_transient_db(_op(code, "x"))
    assert driver_code(_op(code, "x")) == code


@pytest.mark.parametrize("code", [4025, 1146, 1054, 1064, 1406])
def test_check_violation_and_schema_errors_are_not_transient(code: int) -> None:
    assert not is_transient_db(_op(code, "x"))


def test_sqlite_lock_is_transient_but_missing_table_is_not() -> None:
    assert is_transient_db(_op("database is locked"))
    assert not is_transient_db(_op("no such table: orbit_archive_jobs"))


def test_other_error_kinds() -> None:
    assert is_transient_db(DisconnectionError("gone"))
    assert not is_transient_db(IntegrityError("stmt", {}, _DriverError(1062, "dup")))
    assert not is_transient_db(ValueError("x"))
    assert driver_code(ValueError("x")) is None
