"""Many archive plans inserted fast (multi-row inserts), for the tick tests and
``bench/tick_scaling.py``. Rows are written directly with Core inserts: what ``orbit plan set``
would write (ACTIVE namespaces, policy revision 1 per kind, confirmed by the plan), without an
audit row per plan."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import Connection, Engine, bindparam, delete, insert, update

from orbit_tasks.archive.tick import TickReport
from orbit_tasks.archive.wakeups import Publisher, make_publisher
from orbit_tasks.db.platform_tables import (
    KINDS,
    archive_jobs,
    archive_plans,
    archive_policies,
    namespaces,
)
from orbit_tasks.ids import new_id
from orbit_tasks.platform import store
from tests.support.db import redis_url

CHUNK = 2000
MIB = 1024**2


@dataclass(frozen=True)
class PlanKey:
    namespace_id: bytes
    kind: str


def _chunks(rows: Sequence[dict[str, Any]]) -> Iterator[Sequence[dict[str, Any]]]:
    for start in range(0, len(rows), CHUNK):
        yield rows[start : start + CHUNK]


def seed_plans(
    engine: Engine,
    storage_id: bytes,
    count: int,
    *,
    now: dt.datetime,
    interval: int = 3600,
    prefix: str = "n",
) -> list[PlanKey]:
    """``count`` enabled plans on ``storage_id`` (registered here if new), seven kinds per
    namespace, all due in one day (``now + 1 day``); make some due with :func:`make_due`."""
    ns_ids = [new_id() for _ in range((count + len(KINDS) - 1) // len(KINDS))]
    keys = [PlanKey(ns_ids[i // len(KINDS)], KINDS[i % len(KINDS)]) for i in range(count)]
    later = now + dt.timedelta(days=1)
    with engine.begin() as conn:
        store.register_storage(conn, storage_id, "tick-test")
        _insert(
            conn,
            namespaces,
            [
                dict(id=ns, name=f"{prefix}{i}-{ns.hex()[-8:]}", state="ACTIVE", created_at=now)
                for i, ns in enumerate(ns_ids)
            ],
        )
        _insert(
            conn,
            archive_policies,
            [
                dict(
                    namespace_id=k.namespace_id,
                    kind=k.kind,
                    revision=1,
                    archive_after_seconds=7 * 86400,
                    created_at=now,
                    created_by="seed",
                )
                for k in keys
            ],
        )
        _insert(
            conn,
            archive_plans,
            [
                dict(
                    namespace_id=k.namespace_id,
                    kind=k.kind,
                    revision=1,
                    enabled=True,
                    policy_revision=1,
                    storage_id=storage_id,
                    interval_seconds=interval,
                    batch_size=100,
                    max_bytes=256 * MIB,
                    next_run_at=later,
                    active_job_id=None,
                    created_at=now,
                    updated_at=now,
                )
                for k in keys
            ],
        )
    return keys


def _insert(conn: Connection, table: Any, rows: Sequence[dict[str, Any]]) -> None:
    for chunk in _chunks(rows):
        conn.execute(insert(table), list(chunk))


def make_due(engine: Engine, keys: Sequence[PlanKey], at: dt.datetime) -> None:
    """Set ``next_run_at = at`` and clear ``active_job_id`` of ``keys`` (test set-up only)."""
    if not keys:
        return
    P = archive_plans.c
    statement = (
        update(archive_plans)
        .where(P.namespace_id == bindparam("b_ns"), P.kind == bindparam("b_kind"))
        .values(next_run_at=at, active_job_id=None)
    )
    with engine.begin() as conn:
        conn.execute(statement, [{"b_ns": k.namespace_id, "b_kind": k.kind} for k in keys])


def reset_all(engine: Engine, at: dt.datetime, due: Sequence[PlanKey]) -> None:
    """Delete every job, schedule every plan a day after ``at`` and ``due`` at ``at``."""
    with engine.begin() as conn:
        conn.execute(delete(archive_jobs))
        conn.execute(
            update(archive_plans).values(next_run_at=at + dt.timedelta(days=1), active_job_id=None)
        )
    make_due(engine, due, at)


# --- Redis and a real publisher (shared by the tick test modules) ------------------------------

TICK_REDIS_URL = redis_url(2)


@pytest.fixture
def rds() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(TICK_REDIS_URL)
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


@pytest.fixture
def publisher(rds: redis.Redis) -> Iterator[Publisher]:
    """Publishes through a real Celery app on Redis (the same code path as production)."""
    app = Celery("orbit-test-tick", broker=TICK_REDIS_URL, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    try:
        yield make_publisher(app)
    finally:
        app.close()


def race(
    tick_once: Callable[[], TickReport], n: int, *, join_timeout: float = 240
) -> list[TickReport]:
    """``n`` ticks released together by a barrier, each in its own thread; their reports (a
    failure in any thread fails the test)."""
    barrier = threading.Barrier(n)
    reports: list[TickReport] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=30)
            reports.append(tick_once())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=join_timeout)
    assert not errors, errors
    return reports
