"""The tick's time rules at their exact boundaries, through the clock seam, on SQLite AND MariaDB.

``run_tick(..., clock=...)`` reads every "now" through the injected clock, so the due decision
(``next_run_at <= now``), coalescing across many missed periods and the sweep's expired-lease
rule (``lease_until < now``) are tested at ``-1 us``, ``=`` and ``+1 us`` without sleeping. The
same tests run on both databases (``any_platform_url``): the comparisons happen in SQL there.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
import redis
from sqlalchemy import Engine, delete, insert, update

from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.tick import TickReport, run_tick
from orbit_tasks.archive.wakeups import Publisher
from orbit_tasks.db.engine import FixedClock
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans
from orbit_tasks.ids import new_id
from orbit_tasks.queues import queue_name
from orbit_tasks.settings import load_settings
from tests.support import tick as tick_support
from tests.support.db import redis_url
from tests.support.scene import PlanScene

REDIS_URL = redis_url(2)
US = dt.timedelta(microseconds=1)
HOUR = dt.timedelta(hours=1)
T = dt.datetime(2031, 5, 6, 7, 8, 9, 123456)  # far from the real clock: only the seam counts
MIB = 1024**2

pytestmark = pytest.mark.redis


@pytest.fixture
def engine(any_platform_engine: Engine) -> Engine:
    return any_platform_engine


rds = tick_support.rds
publisher = tick_support.publisher


class Plan(PlanScene):
    """One ACTIVE namespace, one registered storage, one enabled hourly ``tasks`` plan created
    at ``T`` (first enable is due immediately: ``next_run_at == T``)."""

    def __init__(self, engine: Engine, interval: int = 3600) -> None:
        super().__init__(engine, name="clock", label="vol", actor="test")
        self.set(interval=interval, batch_size=10, max_bytes=MIB, now=T)

    def row(self) -> plan_store.Plan:
        return self.plan()

    def reset(self, next_run_at: dt.datetime, active_job_id: bytes | None = None) -> None:
        """Test set-up: no jobs, the given schedule (as after a finished job)."""
        with self.engine.begin() as conn:
            conn.execute(delete(archive_jobs))
            conn.execute(
                update(archive_plans).values(next_run_at=next_run_at, active_job_id=active_job_id)
            )


def tick_at(engine: Engine, now: dt.datetime, publisher: Publisher) -> TickReport:
    settings = load_settings({"ORBIT_VAR_DIR": "/tmp/orbit-tick-unused"})
    return run_tick(engine, settings, publisher, clock=FixedClock(now))


def test_due_decision_at_next_run_minus_equal_and_plus_one_microsecond(
    engine: Engine, publisher: Publisher
) -> None:
    p = Plan(engine)
    assert p.row().next_run_at == T

    early = tick_at(engine, T - US, publisher)
    assert early.now == T - US
    assert early.jobs_created == [] and p.jobs() == []
    assert p.row().next_run_at == T  # not due: nothing written

    exact = tick_at(engine, T, publisher)  # next_run_at == now is due
    assert [k for _, k, _ in exact.jobs_created] == ["tasks"]
    (job,) = p.jobs()
    assert job.created_at == job.updated_at == T  # the job's clock is the seam's
    plan = p.row()
    assert plan.next_run_at == T + HOUR and plan.active_job_id == bytes(job.id)
    assert (plan.revision, plan.updated_at) == (1, T)  # ticks never touch either

    p.reset(T + HOUR)  # the job finished; the next slot is T + 1h
    assert tick_at(engine, T + HOUR - US, publisher).jobs_created == []
    assert p.row().next_run_at == T + HOUR
    late = tick_at(engine, T + HOUR + US, publisher)
    assert len(late.jobs_created) == 1
    assert p.row().next_run_at == T + 2 * HOUR


@pytest.mark.parametrize(
    ("offset", "periods_after"),
    [(-US, 0), (dt.timedelta(0), 1), (US, 1)],
    ids=["slot-1us", "slot", "slot+1us"],
)
def test_coalescing_many_missed_periods_at_a_slot_boundary(
    engine: Engine, publisher: Publisher, offset: dt.timedelta, periods_after: int
) -> None:
    """Ten years of hourly runs missed: one job, and ``next_run_at + k*interval`` with the
    smallest k giving a result strictly later than now (phase kept, microseconds included)."""
    p = Plan(engine)
    missed = 24 * 366 * 10
    slot = T + missed * HOUR
    now = slot + offset
    report = tick_at(engine, now, publisher)
    assert len(report.jobs_created) == 1 and len(p.jobs()) == 1
    expected = slot + periods_after * HOUR
    plan = p.row()
    assert plan.next_run_at == expected and plan.next_run_at > now
    assert plan.next_run_at - now <= HOUR

    # The same boundary while a job is still active: the run is coalesced, no second job.
    p.reset(T, active_job_id=new_id())
    report = tick_at(engine, now, publisher)
    assert report.jobs_created == [] and report.coalesced == [(p.ns.hex(), "tasks")]
    assert p.row().next_run_at == expected and p.jobs() == []


def test_coalescing_with_the_largest_interval_keeps_microsecond_phase(
    engine: Engine, publisher: Publisher
) -> None:
    p = Plan(engine, interval=2592000)
    month = dt.timedelta(seconds=2592000)
    now = T + 40 * month - US
    tick_at(engine, now, publisher)
    assert p.row().next_run_at == T + 40 * month
    assert p.row().next_run_at.microsecond == T.microsecond


def _running_job(engine: Engine, p: Plan, lease_until: dt.datetime, kind: str) -> bytes:
    job_id = new_id()
    with engine.begin() as conn:
        conn.execute(
            insert(archive_jobs).values(
                namespace_id=p.ns,
                id=job_id,
                kind=kind,
                plan_revision=1,
                policy_revision=1,
                storage_id=p.storage,
                batch_size=10,
                max_bytes=MIB,
                state="RUNNING",
                lease_id=os.urandom(16),
                lease_until=lease_until,
                created_at=T - HOUR,
                updated_at=T - HOUR,
            )
        )
    return job_id


def _woken(rds: redis.Redis, storage: bytes) -> list[str]:
    raw = rds.lrange(queue_name(storage), 0, -1)
    rds.delete(queue_name(storage))
    return [json.loads(m)["headers"]["argsrepr"] for m in raw]  # type: ignore[arg-type]


def test_sweep_wakes_a_running_job_only_once_its_lease_has_expired(
    engine: Engine, publisher: Publisher, rds: redis.Redis
) -> None:
    p = Plan(engine)
    p.reset(T + 24 * HOUR)  # no plan due: the sweep is all that publishes
    lease_until = T + dt.timedelta(seconds=90)
    job = _running_job(engine, p, lease_until, "events")
    label = f"(kind=events, namespace={p.ns.hex()}, storage={p.storage.hex()}, job={job.hex()})"

    for now, expected in [(lease_until - US, []), (lease_until, []), (lease_until + US, [label])]:
        with engine.connect() as conn:
            swept = plan_store.sweep(conn, p.storage, now, 10)
        assert swept == ([plan_store.SweptJob(p.ns, job, "events")] if expected else [])
        report = tick_at(engine, now, publisher)
        assert report.wakeups_published == len(expected)
        assert _woken(rds, p.storage) == expected, now
