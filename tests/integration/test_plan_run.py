"""``orbit plan run NS KIND`` (issue 25 item 3): archive now, phase kept.

Real MariaDB, the real ``orbit`` script, real Redis; the end-to-end case runs a real
``orbit worker control`` (the tick) and a real ``orbit worker archive``, and nothing ticks
but the wake-up ``plan run`` sends.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_plans, namespaces
from orbit_tasks.errors import IllegalState
from tests.support.archive_jobs import (
    ArchiveEnv,
    assert_succeeded_exactly,
    create_job,
    make_due,
    wait_for,
)
from tests.support.cli import assert_one_line_error
from tests.support.scene import archive_scene

pytestmark = pytest.mark.mariadb

P = archive_plans.c
DAY = 86400


def _setup(ae: ArchiveEnv, name: str, roots: int = 30) -> tuple[bytes, Path]:
    ns, q, vol, sid = archive_scene(
        ae.engine, name=name, volume=ae.tmp / f"vol-{name}", roots=roots, batch_size=5, label=name
    ).parts
    return ns, vol


def _schedule(ae: ArchiveEnv, ns: bytes, ahead: dt.timedelta) -> dt.datetime:
    """The plan's next run ``ahead`` of the database clock (not due); returns it."""
    with ae.engine.begin() as conn:
        at = db_now(conn) + ahead
        conn.execute(
            update(archive_plans)
            .where(P.namespace_id == ns, P.kind == "tasks")
            .values(next_run_at=at)
        )
    return at


def _state(ae: ArchiveEnv, ns: bytes) -> tuple[Any, int]:
    """The plan row and the number of plan-run audit rows of ``ns``."""
    with ae.engine.connect() as conn:
        plan = conn.execute(
            select(archive_plans).where(P.namespace_id == ns, P.kind == "tasks")
        ).one()
        audits = conn.execute(
            select(func.count()).where(
                audit_events.c.namespace_id == ns, audit_events.c.action == "archive.plan.run"
            )
        ).scalar_one()
    return plan, int(audits)


def test_plan_run_keeps_the_phase_one_audit_row_and_the_tick_creates_the_job(
    ae: ArchiveEnv,
) -> None:
    ns, _ = _setup(ae, "phase")
    scheduled = _schedule(ae, ns, dt.timedelta(hours=5))
    assert ae.tick().jobs_created == []  # not due: the interval has 5 hours to go
    proc = ae.orbit("plan", "run", "phase", "tasks", "--json")
    doc = json.loads(proc.stdout)
    assert doc["due"] is True and doc["revision"] == 1  # no configuration changed
    due_at = dt.datetime.strptime(doc["next_run_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert due_at == scheduled - dt.timedelta(days=1)  # whole intervals back: phase kept
    assert doc["next_scheduled"] == scheduled.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert _state(ae, ns)[1] == 1
    job = create_job(ae, ns, "tasks")
    plan, _ = _state(ae, ns)
    assert plan.next_run_at == scheduled  # the run after this job is the one it had
    assert plan.active_job_id == job.id
    # a second run is refused while that job is active, and writes nothing
    before = _state(ae, ns)
    refused = ae.orbit("plan", "run", "phase", "tasks", check=False)
    assert_one_line_error(refused, 3, "active job", job.id.hex(), "PENDING")
    assert _state(ae, ns) == before


def test_plan_run_refusals_and_bad_input_are_one_line_and_write_nothing(ae: ArchiveEnv) -> None:
    ns, _ = _setup(ae, "refuse")
    _schedule(ae, ns, dt.timedelta(hours=5))
    before = _state(ae, ns)
    cases: list[tuple[list[str], int, tuple[str, ...]]] = [
        (["refuse", "nope"], 2, ("kind 'nope'", "allowed")),
        (["missing-ns", "tasks"], 4, ("missing-ns",)),
        (["refuse", "events"], 4, ("no 'events' plan",)),
    ]
    for args, code, needles in cases:
        assert_one_line_error(ae.orbit("plan", "run", *args, check=False), code, *needles)
    ae.orbit("plan", "set", "refuse", "tasks", "--disable")
    disabled = _state(ae, ns)
    proc = ae.orbit("plan", "run", "refuse", "tasks", "--json", check=False)
    assert_one_line_error(proc, 3, "disabled")
    assert _state(ae, ns) == disabled
    ae.orbit("plan", "set", "refuse", "tasks", "--enable")
    ae.orbit("policy", "set", "refuse", "tasks", "--archive-after", "2h")  # revision 2
    _schedule(ae, ns, dt.timedelta(hours=5))
    unconfirmed = _state(ae, ns)
    proc = ae.orbit("plan", "run", "refuse", "tasks", check=False)
    assert_one_line_error(proc, 3, "policy unconfirmed", "revision 1", "latest is 2")
    assert _state(ae, ns) == unconfirmed
    assert before[1] == unconfirmed[1] == 0  # no plan-run audit row at all


def test_plan_run_archives_now_through_real_workers_without_waiting_for_the_interval(
    ae: ArchiveEnv,
) -> None:
    ns, vol = _setup(ae, "now", roots=40)
    scheduled = _schedule(ae, ns, dt.timedelta(hours=20))
    ae.worker("control", [])  # the tick's worker; nothing else ticks in this test
    ae.worker("archive", [vol])
    proc = ae.orbit("plan", "run", "now", "tasks")
    assert "due now" in proc.stdout and "tick was woken" in proc.stdout, proc.stdout

    def done() -> Any:
        jobs = ae.jobs(ns)
        return jobs[0] if jobs and jobs[0].state is JobState.SUCCEEDED else None

    job = wait_for(done, 60, "the plan-run job SUCCEEDED")
    assert_succeeded_exactly(ae, job, vol)
    assert job.roots > 0
    plan, audits = _state(ae, ns)
    assert audits == 1 and plan.next_run_at == scheduled and plan.active_job_id is None


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "READ COMMITTED", "SERIALIZABLE"])
def test_plan_run_sees_the_job_a_tick_committed_after_its_snapshot(
    ae: ArchiveEnv, isolation: str
) -> None:
    """The refusal is decided on the committed plan row (a locking read), not on the
    transaction's snapshot: a tick that created a job after the snapshot is seen, and the run
    is refused with nothing written, at every isolation level."""
    name = "iso-" + isolation.split()[0].lower()
    ns, _ = _setup(ae, name)
    make_due(ae.engine, ns, "tasks")
    with ae.engine.connect() as raw:
        conn = raw.execution_options(isolation_level=isolation)
        with conn.begin():
            # the snapshot: the plan is due and has no active job (a namespace read: at
            # SERIALIZABLE a plan read would share-lock the row the tick must write)
            conn.execute(select(namespaces.c.state).where(namespaces.c.id == ns)).one()
            job = create_job(ae, ns, "tasks")  # another transaction commits the job
            with pytest.raises(IllegalState, match="active job"):
                plan_store.run_plan(conn, ns, "tasks", now=db_now(conn), actor="test")
            conn.rollback()
    plan, audits = _state(ae, ns)
    assert audits == 0 and plan.active_job_id == job.id
