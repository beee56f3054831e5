"""Contract of the archive controls' store on SQLite and MariaDB (docs/archive-controls.md):
the generation compared inside a chained confirm (a change is ``ControlsChanged`` while the
fence holds, ``LeaseLost`` once it does not, an unchanged generation confirms), the throttle's
compare-and-set budget at exact instants, and the waits opened and closed by reason."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Engine

from orbit_tasks.archive.controls import ControlKind, Scope, WaitReason
from orbit_tasks.archive.store import controls as control_store
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.db.engine import FixedClock
from orbit_tasks.errors import LeaseLost
from tests.contract.test_job_store_contract import LEASE, SHA, T0, US, _claim, _job, _read

SEC = dt.timedelta(seconds=1)


@pytest.fixture
def engine(any_platform_engine: Engine) -> Engine:
    return any_platform_engine


def _pause(engine: Engine, scope: Scope, clear: bool = False) -> bool:
    with engine.begin() as conn:
        return control_store.change(
            conn,
            control_store.Change(ControlKind.PAUSE, scope, clear=clear, reason="r"),
            actor="op",
            clock=FixedClock(T0),
        )


def _confirm(engine: Engine, c: job_store.Claim, generation: int) -> job_store.Claim | None:
    return job_store.confirm(
        engine, c, is_batch=False, roots=0, size=10, sha256=SHA, after="chain",
        lease_seconds=LEASE, clock=FixedClock(T0 + SEC), generation=generation,
    )  # fmt: skip


def test_a_chained_confirm_sees_a_changed_generation(engine: Engine) -> None:
    job = _job(engine)
    with engine.connect() as conn:
        assert control_store.read_generation(conn) == 0  # no row yet
    c = _claim(engine, job, T0)
    assert c is not None
    assert _pause(engine, Scope(storage_id=job.storage_id))
    with engine.connect() as conn:
        gen = control_store.read_generation(conn)
    assert gen == 1
    before = _read(engine, job.namespace_id, job.id)
    with pytest.raises(job_store.ControlsChanged):
        _confirm(engine, c, 0)  # the generation the chain read before the pause
    assert _read(engine, job.namespace_id, job.id) == before  # nothing written
    nxt = _confirm(engine, c, gen)  # confirmed with the generation read again
    assert nxt is not None and _read(engine, job.namespace_id, job.id).batches == 0
    assert _read(engine, job.namespace_id, job.id).last_sha256 == SHA
    # a release is not guarded: it confirms whatever the controls say
    job_store.confirm(
        engine, nxt, is_batch=True, roots=1, size=10, sha256="cd" * 32, after="release",
        lease_seconds=LEASE, clock=FixedClock(T0 + 2 * SEC), generation=0,
    )  # fmt: skip
    done = _read(engine, job.namespace_id, job.id)
    assert (done.state.value, done.attempts, done.batches) == ("PENDING", 2, 1)


def test_a_lost_lease_is_still_lease_lost_with_a_changed_generation(engine: Engine) -> None:
    job = _job(engine)
    stale = _claim(engine, job, T0)
    assert stale is not None and stale.job.lease_until is not None
    assert _claim(engine, job, stale.job.lease_until + US) is not None  # taken over
    assert _pause(engine, Scope())
    with pytest.raises(LeaseLost):
        _confirm(engine, stale, 0)


def test_changes_bump_the_generation_and_a_clear_of_nothing_writes_nothing(
    engine: Engine,
) -> None:
    scope = Scope(namespace_id=b"\x07" * 16, kind="events")
    assert not _pause(engine, scope, clear=True)
    with engine.connect() as conn:
        assert control_store.read_generation(conn) == 0
    assert _pause(engine, scope) and _pause(engine, scope)  # set again: replaced
    with engine.connect() as conn:
        assert control_store.read_generation(conn) == 2
        (ctl,) = control_store.list_controls(conn)
        assert ctl.scope == scope and ctl.since == T0 and ctl.actor == "op"
        assert control_store.controls_for(conn, b"\x01" * 16, scope.namespace_id, "events")
        assert not control_store.controls_for(conn, b"\x01" * 16, scope.namespace_id, "tasks")
    assert _pause(engine, scope, clear=True)
    with engine.connect() as conn:
        assert control_store.read_generation(conn) == 3 and not control_store.list_controls(conn)


def test_the_budget_is_taken_by_compare_and_set_at_exact_instants(engine: Engine) -> None:
    with engine.connect() as conn:
        conn = conn.execution_options()  # one connection, each call its own transaction
        at = FixedClock(T0)
        assert control_store.take_budget(conn, "k", 100, 200, clock=at) == 0.0
        assert control_store.take_budget(conn, "k", 100, 200, clock=at) == 0.5
        with conn.begin():
            assert control_store.budget_waits(conn, ["k"], clock=at) == 1.0
            assert control_store.budget_waits(conn, ["k"], clock=FixedClock(T0 + SEC)) == 0.0
            assert control_store.budget_waits(conn, ["other"], clock=at) == 0.0
        later = FixedClock(T0 + 10 * SEC)  # idle: nothing saved up
        assert control_store.take_budget(conn, "k", 100, 200, clock=later) == 0.0
        with conn.begin():
            wait = control_store.budget_waits(conn, ["k"], clock=later)
        assert wait == 0.5


def test_waits_open_switch_and_close_by_reason(engine: Engine) -> None:
    job = _job(engine)
    ns, jid = job.namespace_id, job.id
    with engine.begin() as conn:
        control_store.record_wait(conn, ns, jid, WaitReason.PAUSED, T0)
        control_store.record_wait(conn, ns, jid, WaitReason.PAUSED, T0 + SEC)  # keeps its start
        assert control_store.has_open_wait(conn, ns, jid)
        control_store.record_wait(conn, ns, jid, WaitReason.WINDOW, T0 + 3 * SEC)
        rows = {r: (since, us) for r, since, us in control_store.job_waits(conn, ns, jid)}
        assert rows == {"paused": (None, 3_000_000), "window": (T0 + 3 * SEC, 0)}
        assert control_store.waiting_counts(conn) == {(job.storage_id, "window"): 1}
        control_store.close_waits(conn, ns, jid, T0 + 4 * SEC + US)
        rows = {r: (since, us) for r, since, us in control_store.job_waits(conn, ns, jid)}
        assert rows == {"paused": (None, 3_000_000), "window": (None, 1_000_001)}
        assert not control_store.has_open_wait(conn, ns, jid)
        assert control_store.waiting_counts(conn) == {}
