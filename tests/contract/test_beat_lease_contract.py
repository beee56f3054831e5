"""The beat leader's lease store on both databases (issue 30 item 3), at exact clock boundaries
through the clock seam: take, renew, a standby refused, a takeover strictly after the end, the
epoch, fenced tick records, a resign."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from orbit_tasks.beat import store
from orbit_tasks.db.engine import FixedClock
from tests.support.db import mariadb_database, migrated_engine

T0 = dt.datetime(2026, 12, 3, 12, 0, 0, 123456)
A, B = b"a" * 16, b"b" * 16


@pytest.fixture(params=["mariadb", "sqlite"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "mariadb":
        with mariadb_database() as url, migrated_engine(url, "platform") as e:
            yield e
    else:
        with migrated_engine(f"sqlite:///{tmp_path / 'p.sqlite3'}", "platform") as e:
            yield e


def _lead(engine: Engine, clock: FixedClock, who: bytes, lease: int = 3) -> bool:
    with engine.begin() as conn:
        return store.take_or_renew(conn, clock, holder=who.decode()[:1], lease_id=who, lease=lease)


def _read(engine: Engine, clock: FixedClock) -> store.Leader:
    with engine.connect() as conn:
        row = store.read(conn, clock)
    assert row is not None
    return row


def test_take_renew_standby_and_takeover_at_exact_boundaries(engine: Engine) -> None:
    clock = FixedClock(T0)
    with engine.connect() as conn:
        assert store.read(conn, clock) is None
    assert _lead(engine, clock, A)  # the first beat takes the empty lease
    first = _read(engine, clock)
    assert (first.holder, first.lease_id, first.epoch) == ("a", A, 1)
    assert first.lease_until == T0 + dt.timedelta(seconds=3)
    assert not _lead(engine, clock, B)  # a standby is refused while the lease holds
    clock.set(T0 + dt.timedelta(seconds=2))
    assert _lead(engine, clock, A)  # renewed: same epoch, same acquired_at
    renewed = _read(engine, clock)
    assert (renewed.epoch, renewed.acquired_at) == (1, T0)
    assert renewed.lease_until == T0 + dt.timedelta(seconds=5)
    clock.set(T0 + dt.timedelta(seconds=5))  # at lease_until the lease still holds
    assert not _lead(engine, clock, B)
    clock.set(T0 + dt.timedelta(seconds=5, microseconds=1))  # one microsecond later: expired
    assert _lead(engine, clock, B)
    taken = _read(engine, clock)
    assert (taken.holder, taken.lease_id, taken.epoch) == ("b", B, 2)
    assert taken.acquired_at == T0 + dt.timedelta(seconds=5, microseconds=1)
    assert not _lead(engine, clock, A)  # the deposed leader's renewal finds it gone


def test_ticks_are_recorded_only_by_the_leader(engine: Engine) -> None:
    clock = FixedClock(T0)
    assert _lead(engine, clock, A)
    clock.set(T0 + dt.timedelta(seconds=1))
    with engine.begin() as conn:
        assert store.record_tick(conn, clock, lease_id=A)
        assert not store.record_tick(conn, clock, lease_id=B)  # fenced: B does not lead
    assert _read(engine, clock).last_tick_at == T0 + dt.timedelta(seconds=1)
    clock.set(T0 + dt.timedelta(seconds=10))
    assert _lead(engine, clock, B)  # a new leader starts with no tick of its own
    assert _read(engine, clock).last_tick_at is None


def test_a_resigned_lease_is_taken_at_once(engine: Engine) -> None:
    clock = FixedClock(T0)
    assert _lead(engine, clock, A)
    with engine.begin() as conn:
        store.resign(conn, clock, lease_id=B)  # not B's: nothing changes
    assert not _lead(engine, clock, B)
    with engine.begin() as conn:
        store.resign(conn, clock, lease_id=A)
    assert _lead(engine, clock, B)
    assert _read(engine, clock).epoch == 2
