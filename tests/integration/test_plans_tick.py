"""Archive plans, ticks, sweep and wake-ups on the real MariaDB (and SQLite) and the real Redis."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result
from sqlalchemy import Engine, insert, select, text, update

from orbit_tasks.archive import plans as schedule
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.archive.wakeups import Publisher, make_publisher
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans
from orbit_tasks.errors import IllegalState, InvalidInput, NotFound, StaleRevision
from orbit_tasks.ids import new_id
from orbit_tasks.platform import store
from orbit_tasks.queues import queue_name
from orbit_tasks.settings import Settings, load_settings
from tests.support import tick as tick_support
from tests.support.db import migrated_engine, redis_url
from tests.support.scene import PlanScene

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = redis_url(2)
MIB = 1024**2
GIB = 1024**3
DAY = 86400


# --- fixtures -----------------------------------------------------------------------------------


rds = tick_support.rds
publisher = tick_support.publisher


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    with migrated_engine(f"sqlite:///{tmp_path / 'platform.sqlite3'}", "platform") as engine:
        yield engine


def settings(**over: Any) -> Settings:
    return load_settings({"ORBIT_VAR_DIR": "/tmp/orbit-a-unused"}).with_overrides(**over)


# --- plan set: validation writes nothing --------------------------------------------------------


@pytest.fixture
def cli(platform_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """In-process ``orbit`` against the test database (settings cache and engines reset)."""
    from orbit_tasks.cli.main import cli as orbit_cli
    from orbit_tasks.db import registry
    from orbit_tasks.settings import get_settings

    monkeypatch.setenv("ORBIT_DATABASE_URL", str(platform_engine.url.render_as_string(False)))
    monkeypatch.setenv("ORBIT_ACTOR", "alice\U0001f6f0")  # 4-byte UTF-8 end to end

    def reset() -> None:
        get_settings.cache_clear()
        with registry._lock:
            for engine in registry._engines.values():
                engine.dispose()
            registry._engines.clear()

    def invoke(*args: str) -> Result:
        reset()
        try:
            return CliRunner().invoke(orbit_cli, list(args), catch_exceptions=False)
        finally:
            reset()

    yield invoke
    reset()


@pytest.mark.mariadb
def test_plan_set_validation_errors_exit_codes_and_write_nothing(
    platform_engine: Engine, cli: Any
) -> None:
    w = PlanScene(platform_engine)
    with platform_engine.begin() as conn:
        store.create_namespace(conn, "sleepy")
        sleepy = store.resolve_namespace(conn, "sleepy").id
        store.add_policy_revision(conn, sleepy, "tasks", 7 * DAY, "test")
        store.set_namespace_state(conn, sleepy, "DISABLED")
    before = w.counts()
    st = w.storage.hex()
    base = ["--storage", st, "--interval", "1d", "--batch-size", "100", "--max-bytes", "256MiB"]
    base += ["--policy-revision", "1", "--enable"]
    cases: list[tuple[list[str], int, str]] = [
        (["acme", "tasks", *base, "--interval", "3599s"], 2, "3600..2592000"),
        (["acme", "tasks", *base, "--interval", "3600"], 2, "the number needs a unit"),
        (["acme", "tasks", *base, "--interval", "2592001s"], 2, "--interval 2592001s"),
        (["acme", "tasks", *base, "--batch-size", "0"], 2, "--batch-size 0"),
        (["acme", "tasks", *base, "--batch-size", "101"], 2, "allowed 1..100"),
        (["acme", "tasks", *base, "--max-bytes", f"{MIB - 1}B"], 2, "1MiB..1GiB"),
        (["acme", "tasks", *base, "--max-bytes", f"{GIB + 1}B"], 2, f"--max-bytes {GIB + 1}"),
        (["acme", "tasks", *base, "--max-bytes", "lots"], 2, "not a size"),
        (["acme", "task", *base], 2, "not a history kind"),
        (["acme", "tasks", *base, "--storage", new_id().hex()], 4, "is not registered"),
        (["acme", "tasks", *base, "--storage", "xyz"], 2, "not 32 hexadecimal"),
        (["nobody", "tasks", *base], 4, "namespace 'nobody' does not exist"),
        (["sleepy", "tasks", *base], 3, "DISABLED"),
        (["acme", "tasks", *base, "--policy-revision", "2"], 2, "allowed 1..1"),
        (["acme", "tasks", *base, "--policy-revision", "0"], 2, "--policy-revision 0"),
        (["acme", "events", *base], 4, "no retention policy for kind 'events'"),
        (["acme", "tasks", *base, "--expect-revision", "3"], 3, "does not exist"),
        (["acme", "tasks", "--storage", st, "--interval", "1d"], 2, "a new plan needs"),
    ]
    for args, code, message in cases:
        result = cli("plan", "set", *args)
        assert result.exit_code == code, (args, result.output)
        assert message in result.output, (args, result.output)
        assert w.counts() == before, args

    ok = cli("plan", "set", "acme", "tasks", *base, "--expect-revision", "0", "--json")
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.output)
    assert (data["revision"], data["created"], data["namespace"]) == (1, True, "acme")
    assert data["namespace_id"] == w.ns.hex() and data["policy_confirmed"] is True
    after_create = w.counts()
    assert after_create == (before[0] + 1, before[1], before[2] + 1)
    with platform_engine.connect() as conn:
        actor = conn.execute(
            select(audit_events.c.actor).where(audit_events.c.action == "archive.plan.set")
        ).scalar_one()
    assert actor == "alice\U0001f6f0"

    stale = cli("plan", "set", "acme", "tasks", "--batch-size", "5", "--expect-revision", "0")
    assert stale.exit_code == 3 and "is at revision 1, not 0" in stale.output
    bad_update = cli("plan", "set", "acme", "tasks", "--batch-size", "101")
    assert bad_update.exit_code == 2
    assert w.counts() == after_create
    assert w.plan().batch_size == 100 and w.plan().revision == 1

    # Plain text prints the revision on stdout; --expect-revision matching is accepted.
    good = cli("plan", "set", "acme", "tasks", "--batch-size", "5", "--expect-revision", "1")
    assert good.exit_code == 0 and good.stdout.strip() == "2"


@pytest.mark.mariadb
def test_revision_bumps_only_on_operator_change_and_ticks_never_touch_it(
    platform_engine: Engine, publisher: Publisher
) -> None:
    w = PlanScene(platform_engine)
    first = w.set(enabled=False)
    assert (first.created, first.changed, first.plan.revision) == (True, True, 1)
    assert first.plan.enabled is False
    _, _, audits = w.counts()

    same = w.set(enabled=False)
    assert (same.created, same.changed, same.plan.revision) == (False, False, 1)
    assert same.plan.updated_at == first.plan.updated_at
    assert w.counts()[2] == audits  # a no-op writes no audit row either

    enabled = w.set(enabled=True)  # disabled -> enabled: due now
    assert (enabled.changed, enabled.plan.revision) == (True, 2)
    assert enabled.plan.updated_at > first.plan.updated_at
    assert enabled.plan.next_run_at == enabled.plan.updated_at  # first enable is due immediately
    with platform_engine.connect() as conn:
        audit = conn.execute(
            select(audit_events).order_by(audit_events.c.created_at.desc()).limit(1)
        ).one()
    assert (audit.action, audit.actor, audit.target_id) == ("archive.plan.set", "tester", "tasks")
    detail = json.loads(audit.detail_json)
    assert detail["revision"] == 2 and detail["changes"] == {"enabled": [False, True]}

    before_tick = w.plan()
    report = run_tick(platform_engine, settings(), publisher)
    assert len(report.jobs_created) == 1
    after_tick = w.plan()
    assert after_tick.revision == before_tick.revision == 2
    assert after_tick.updated_at == before_tick.updated_at
    assert after_tick.next_run_at == before_tick.next_run_at + dt.timedelta(days=1)
    assert after_tick.active_job_id is not None

    # Interval change keeps the scheduled next run; batch change bumps the revision.
    changed = w.set(interval=2 * DAY, batch_size=7)
    assert changed.plan.revision == 3
    assert changed.plan.next_run_at == after_tick.next_run_at
    assert changed.plan.active_job_id == after_tick.active_job_id  # ticks' columns untouched
    # Changing the storage while a job is active is allowed: the job keeps its frozen storage.
    other = new_id()
    with platform_engine.begin() as conn:
        store.register_storage(conn, other, "vol-b")
    moved = w.set(storage_id=other)
    assert moved.plan.revision == 4 and moved.plan.storage_id == other
    assert bytes(w.jobs()[0].storage_id) == w.storage

    # Re-enable after a disable is due now again.
    w.set(enabled=False)
    w.move_next_run(-dt.timedelta(days=5))  # far in the future
    again = w.set(enabled=True)
    assert again.plan.revision == 6 and again.plan.next_run_at == again.plan.updated_at


@pytest.mark.mariadb
def test_set_plan_store_errors(platform_engine: Engine) -> None:
    w = PlanScene(platform_engine)
    with pytest.raises(NotFound, match="does not exist"), platform_engine.begin() as conn:
        plan_store.set_plan(
            conn,
            new_id(),
            "tasks",
            storage_id=w.storage,
            interval=DAY,
            batch_size=1,
            max_bytes=MIB,
            policy_revision=1,
            enabled=True,
            expect_revision=None,
            now=db_now(conn),
            actor="t",
        )
    w.set()
    with pytest.raises(StaleRevision):
        w.set(batch_size=3, expect_revision=7)
    with pytest.raises(InvalidInput, match="expect_revision -1"):
        w.set(batch_size=3, expect_revision=-1)
    with platform_engine.begin() as conn:
        store.set_namespace_state(conn, w.ns, "DISABLED")
    with pytest.raises(IllegalState, match="DISABLED"):
        w.set(batch_size=3)
    assert w.plan().revision == 1


# --- ticks --------------------------------------------------------------------------------------


@pytest.mark.mariadb
@pytest.mark.redis
def test_tick_creates_one_job_with_frozen_fields_and_wakes_it(
    platform_engine: Engine, publisher: Publisher, rds: redis.Redis
) -> None:
    w = PlanScene(platform_engine)
    plan = w.set(batch_size=9, max_bytes=3 * MIB).plan
    report = run_tick(platform_engine, settings(), publisher)
    assert report.storages == 1 and len(report.jobs_created) == 1
    ns_hex, kind, job_hex = report.jobs_created[0]
    assert (ns_hex, kind) == (w.ns.hex(), "tasks")
    (job,) = w.jobs()
    assert bytes(job.id).hex() == job_hex
    assert (job.state, job.kind, job.plan_revision, job.policy_revision) == (
        "PENDING",
        "tasks",
        plan.revision,
        1,
    )
    assert (bytes(job.storage_id), job.batch_size, job.max_bytes) == (w.storage, 9, 3 * MIB)
    assert job.created_at == job.updated_at and job.attempts == 0 and job.revision == 1
    assert job.lease_id is None and job.lease_until is None
    assert w.plan().active_job_id == bytes(job.id)

    # The sweep of the same tick published the wake-up for the new PENDING job.
    assert report.wakeups_published == 1
    raw = rds.lrange(queue_name(w.storage), 0, -1)
    assert len(raw) == 1
    message = json.loads(raw[0])
    assert message["headers"]["task"] == "orbit.archive.run_job"
    assert message["headers"].get("eta") is None and message["headers"].get("countdown") is None
    assert message["headers"]["argsrepr"] == (
        f"(kind=tasks, namespace={w.ns.hex()}, storage={w.storage.hex()}, job={job_hex})"
    )

    # A second tick right away creates nothing new but wakes the still-PENDING job again.
    again = run_tick(platform_engine, settings(), publisher)
    assert again.jobs_created == [] and again.coalesced == []
    assert len(w.jobs()) == 1
    assert rds.llen(queue_name(w.storage)) == 2


@pytest.mark.mariadb
def test_policy_unconfirmed_creates_no_job_and_keeps_next_run(
    platform_engine: Engine, publisher: Publisher
) -> None:
    w = PlanScene(platform_engine)
    w.set()
    with platform_engine.begin() as conn:
        assert store.add_policy_revision(conn, w.ns, "tasks", 9 * DAY, "admin") == 2
    before = w.plan()
    report = run_tick(platform_engine, settings(), publisher)
    assert report.jobs_created == [] and report.policy_unconfirmed == [(w.ns.hex(), "tasks")]
    assert w.jobs() == []
    assert w.plan() == before  # next_run_at not advanced, nothing touched
    # Confirming the latest revision makes the very next tick create the job.
    confirmed = w.set(policy_revision=2).plan
    assert confirmed.next_run_at == before.next_run_at  # still due (enabled didn't change)
    report = run_tick(platform_engine, settings(), publisher)
    assert len(report.jobs_created) == 1 and report.policy_unconfirmed == []
    assert w.jobs()[0].policy_revision == 2


@pytest.mark.mariadb
def test_active_job_coalesces_many_missed_runs_into_one_and_keeps_phase(
    platform_engine: Engine, publisher: Publisher
) -> None:
    w = PlanScene(platform_engine)
    w.set(interval=3600)
    assert len(run_tick(platform_engine, settings(), publisher).jobs_created) == 1
    job_id = w.plan().active_job_id
    # 50 runs missed, and the job is still active.
    seen = w.move_next_run(dt.timedelta(hours=50, minutes=20))
    report = run_tick(platform_engine, settings(), publisher)
    assert report.jobs_created == [] and report.coalesced == [(w.ns.hex(), "tasks")]
    plan = w.plan()
    assert plan.active_job_id == job_id and len(w.jobs()) == 1
    assert plan.next_run_at == seen + dt.timedelta(hours=51)  # one run, phase kept
    assert report.now is not None and plan.next_run_at > report.now
    # Once the job is done (B clears active_job_id), a due tick creates exactly one new job.
    with platform_engine.begin() as conn:
        conn.execute(update(archive_plans).values(active_job_id=None))
    seen = w.move_next_run(dt.timedelta(hours=3, minutes=1))
    report = run_tick(platform_engine, settings(), publisher)
    assert len(report.jobs_created) == 1 and len(w.jobs()) == 2
    assert w.plan().next_run_at == seen + dt.timedelta(hours=4)


@pytest.mark.mariadb
def test_disabled_namespace_or_plan_gets_no_job(
    platform_engine: Engine, publisher: Publisher
) -> None:
    w = PlanScene(platform_engine)
    w.set()
    with platform_engine.begin() as conn:
        store.set_namespace_state(conn, w.ns, "DISABLED")
    before = w.plan()
    report = run_tick(platform_engine, settings(), publisher)
    assert report.jobs_created == [] and report.namespace_inactive == [(w.ns.hex(), "tasks")]
    assert w.jobs() == []
    after = w.plan()
    assert after.next_run_at == before.next_run_at + dt.timedelta(days=1)  # this run skipped
    assert (after.revision, after.updated_at) == (before.revision, before.updated_at)

    with platform_engine.begin() as conn:
        store.set_namespace_state(conn, w.ns, "ACTIVE")
    w.set(enabled=False)
    w.move_next_run(dt.timedelta(days=3))
    report = run_tick(platform_engine, settings(), publisher)
    assert report.jobs_created == [] and report.namespace_inactive == [] and w.jobs() == []


@pytest.mark.mariadb
def test_two_concurrent_ticks_create_exactly_one_job_per_plan(
    platform_engine: Engine, publisher: Publisher
) -> None:
    worlds = [PlanScene(platform_engine, name=f"ns{i}") for i in range(6)]
    kinds = ["tasks", "events", "audit"]
    for w in worlds:
        with platform_engine.begin() as conn:
            for kind in kinds[1:]:
                store.add_policy_revision(conn, w.ns, kind, 7 * DAY, "test")
        for kind in kinds:
            w.set(kind, storage_id=worlds[0].storage)
    total_plans = len(worlds) * len(kinds)
    for _round in range(3):
        reports = tick_support.race(lambda: run_tick(platform_engine, settings(), publisher), 2)
        created = [j for r in reports for j in r.jobs_created]
        assert len(created) == total_plans
        assert len({(ns, kind) for ns, kind, _ in created}) == total_plans
        # Re-arm: finish every job (as B would) and make every plan due again.
        with platform_engine.begin() as conn:
            conn.execute(
                update(archive_plans).values(
                    active_job_id=None, next_run_at=db_now(conn) - dt.timedelta(seconds=1)
                )
            )
    assert worlds[0].counts()[1] == 3 * total_plans


@pytest.mark.mariadb
def test_two_tick_processes_at_once_create_one_job(
    platform_engine: Engine, rds: redis.Redis
) -> None:
    w = PlanScene(platform_engine)
    w.set()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(
        ORBIT_DATABASE_URL=platform_engine.url.render_as_string(False), CELERY_BROKER_URL=REDIS_URL
    )
    cmd = [str(REPO / ".venv/bin/orbit"), "archive", "tick", "--json"]
    procs = [
        subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    reports = [json.loads(o[0]) for o in outs]
    assert sum(len(r["jobs_created"]) for r in reports) == 1
    (job,) = w.jobs()
    # The published wake-ups really arrived in Redis (the CLI used CELERY_BROKER_URL).
    assert rds.llen(queue_name(w.storage)) == sum(r["wakeups_published"] for r in reports) >= 1
    body = json.loads(rds.lindex(queue_name(w.storage), 0))  # type: ignore[arg-type]
    assert bytes(job.id).hex() in body["headers"]["argsrepr"]


# --- sweep --------------------------------------------------------------------------------------


def _insert_job(engine: Engine, ns: bytes, storage: bytes, state: str, **kw: Any) -> bytes:
    job_id = new_id()
    with engine.begin() as conn:
        now = db_now(conn)
        values: dict[str, Any] = dict(
            namespace_id=ns,
            id=job_id,
            kind="tasks",
            plan_revision=1,
            policy_revision=1,
            storage_id=storage,
            batch_size=10,
            max_bytes=MIB,
            state=state,
            created_at=now,
            updated_at=now,
        )
        if state == "RUNNING":
            values.update(lease_id=os.urandom(16), lease_until=now + dt.timedelta(seconds=60))
        values.update(kw)
        conn.execute(insert(archive_jobs).values(**values))
    return job_id


@pytest.mark.mariadb
@pytest.mark.redis
def test_sweep_finds_pending_and_expired_running_and_is_bounded(
    platform_engine: Engine, publisher: Publisher, rds: redis.Redis
) -> None:
    w = PlanScene(platform_engine)
    other = new_id()
    with platform_engine.begin() as conn:
        store.register_storage(conn, other, "vol-b")
        now = db_now(conn)
    ago = lambda s: now - dt.timedelta(seconds=s)  # noqa: E731
    e = platform_engine
    pend_old = _insert_job(e, w.ns, w.storage, "PENDING", updated_at=ago(300))
    pend_new = _insert_job(e, w.ns, w.storage, "PENDING", updated_at=ago(10))
    expired = _insert_job(
        e, w.ns, w.storage, "RUNNING", lease_id=b"1" * 16, lease_until=ago(5), updated_at=ago(200)
    )
    _insert_job(e, w.ns, w.storage, "RUNNING")  # live lease: not swept
    for state in ("SUCCEEDED", "FAILED", "ABANDONED"):
        _insert_job(e, w.ns, w.storage, state)
    pend_other = _insert_job(e, w.ns, other, "PENDING")

    with e.connect() as conn:
        found = plan_store.sweep(conn, w.storage, db_now(conn), 10)
        assert [j.job_id for j in found] == [expired, pend_old, pend_new]
        assert {(j.namespace_id, j.kind) for j in found} == {(w.ns, "tasks")}
        assert [j.job_id for j in plan_store.sweep(conn, w.storage, db_now(conn), 2)] == [
            expired,
            pend_old,
        ]
        assert plan_store.sweep(conn, w.storage, db_now(conn), 0) == []
        assert [j.job_id for j in plan_store.sweep(conn, other, db_now(conn), 10)] == [pend_other]

    report = run_tick(e, settings(), publisher)
    assert report.wakeups_published == 4
    assert rds.llen(queue_name(w.storage)) == 3 and rds.llen(queue_name(other)) == 1

    rds.flushdb()
    for _ in range(6):
        _insert_job(e, w.ns, other, "PENDING")
    report = run_tick(e, settings(archive_wakeups_per_tick=4), publisher)
    assert report.wakeups_published == 4
    assert rds.llen(queue_name(w.storage)) == 2 and rds.llen(queue_name(other)) == 2
    rds.flushdb()
    report = run_tick(e, settings(archive_wakeups_per_tick=8), publisher)
    assert report.wakeups_published == 8  # share 4 each; the first storage's spare 1 moves on
    assert rds.llen(queue_name(w.storage)) == 3 and rds.llen(queue_name(other)) == 5


# --- SQLite (embedded default) ------------------------------------------------------------------


@pytest.mark.redis
def test_plan_and_tick_on_sqlite(sqlite_engine: Engine, publisher: Publisher) -> None:
    w = PlanScene(sqlite_engine)
    w.set(enabled=False)
    assert run_tick(sqlite_engine, settings(), publisher).jobs_created == []
    assert w.set(enabled=True).plan.revision == 2
    report = run_tick(sqlite_engine, settings(), publisher)
    assert len(report.jobs_created) == 1 and report.wakeups_published == 1
    assert w.plan().revision == 2 and w.plan().active_job_id == bytes(w.jobs()[0].id)
    w.move_next_run(dt.timedelta(days=3, hours=1))
    report = run_tick(sqlite_engine, settings(), publisher)
    assert report.coalesced == [(w.ns.hex(), "tasks")] and len(w.jobs()) == 1
    reports = tick_support.race(lambda: run_tick(sqlite_engine, settings(), publisher), 2)
    assert all(r.jobs_created == [] for r in reports)


# --- CLI list/show ------------------------------------------------------------------------------


@pytest.mark.mariadb
def test_plan_list_and_show_report_policy_confirmation(platform_engine: Engine, cli: Any) -> None:
    w = PlanScene(platform_engine, name="zoë-ns".replace("ë", "e"))
    w.set(max_bytes=GIB)
    shown = json.loads(cli("plan", "show", w.ns.hex(), "tasks", "--json").output)
    assert shown["policy_confirmed"] is True and shown["latest_policy_revision"] == 1
    assert shown["due"] is True and shown["active_job_id"] is None
    assert shown["max_bytes"] == GIB and shown["storage_id"] == w.storage.hex()
    with platform_engine.begin() as conn:
        store.add_policy_revision(conn, w.ns, "tasks", 9 * DAY, "admin")
    shown = json.loads(cli("plan", "show", "zoe-ns", "tasks", "--json").output)
    assert shown["policy_confirmed"] is False and shown["latest_policy_revision"] == 2
    text_out = cli("plan", "show", "zoe-ns", "tasks").output
    assert "POLICY UNCONFIRMED" in text_out and "next_run_at" in text_out
    listed = json.loads(cli("plan", "list", "--json").output)
    assert listed["next"] is None
    assert [(p["namespace"], p["kind"], p["policy_confirmed"]) for p in listed["items"]] == [
        ("zoe-ns", "tasks", False)
    ]
    assert "UNCONFIRMED" in cli("plan", "list", "zoe-ns").output
    missing = cli("plan", "show", "zoe-ns", "events")
    assert missing.exit_code == 4 and "has no 'events' plan" in missing.output
    assert cli("plan", "list", "ghost").exit_code == 4
    for args in (["plan", "--help"], ["plan", "set", "--help"], ["archive", "tick", "--help"]):
        assert cli(*args).exit_code == 0


# --- EXPLAIN: hot queries use their indexes -----------------------------------------------------


def _explain_key(conn: Any, query: Any) -> str:
    compiled = query.compile(dialect=conn.dialect)
    params = compiled.construct_params()
    args = tuple(params[k] for k in compiled.positiontup)
    rows = conn.exec_driver_sql("EXPLAIN " + compiled.string, args).mappings().all()
    assert len(rows) == 1, rows
    assert "filesort" not in str(rows[0]["Extra"]), rows  # index order serves ORDER BY
    return str(rows[0]["key"])


@pytest.mark.mariadb
def test_explain_due_plans_and_sweep_use_their_indexes(platform_engine: Engine) -> None:
    e = platform_engine
    storages = [new_id() for _ in range(8)]
    with e.begin() as conn:
        now = db_now(conn)
        plan_rows = []
        job_rows = []
        for i in range(400):
            storage = storages[i % len(storages)]
            plan_rows.append(
                dict(
                    namespace_id=new_id(),
                    kind="tasks",
                    revision=1,
                    enabled=i % 3 != 0,
                    policy_revision=1,
                    storage_id=storage,
                    interval_seconds=3600,
                    batch_size=10,
                    max_bytes=MIB,
                    next_run_at=now + dt.timedelta(minutes=i - 200),
                    created_at=now,
                    updated_at=now,
                )
            )
            state = ("PENDING", "RUNNING", "SUCCEEDED", "SUCCEEDED", "FAILED")[i % 5]
            running = state == "RUNNING"
            job_rows.append(
                dict(
                    namespace_id=new_id(),
                    id=new_id(),
                    kind="tasks",
                    plan_revision=1,
                    policy_revision=1,
                    storage_id=storage,
                    batch_size=10,
                    max_bytes=MIB,
                    state=state,
                    lease_id=os.urandom(16) if running else None,
                    lease_until=now + dt.timedelta(seconds=i - 200) if running else None,
                    created_at=now,
                    updated_at=now - dt.timedelta(seconds=i),
                )
            )
        conn.execute(insert(archive_plans), plan_rows)
        conn.execute(insert(archive_jobs), job_rows)
    with e.connect() as conn:
        conn.execute(text("ANALYZE TABLE orbit_archive_plans, orbit_archive_jobs")).all()
        s = storages[1]
        assert _explain_key(conn, plan_store.due_plans_query(s, now, 200)) == "ix_archive_plan_due"
        cursor = (now - dt.timedelta(minutes=100), new_id(), "tasks")
        assert (
            _explain_key(conn, plan_store.due_plans_query(s, now, 200, cursor))
            == "ix_archive_plan_due"
        )
        assert _explain_key(conn, plan_store.pending_query(s, 50)) == "ix_archive_job_claim"
        assert (
            _explain_key(conn, plan_store.expired_running_query(s, now, 50))
            == "ix_archive_job_claim"
        )


# --- paging and transient faults ----------------------------------------------------------------


@pytest.mark.mariadb
def test_due_scan_pages_past_plans_that_stay_due(
    platform_engine: Engine, publisher: Publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orbit_tasks.archive import tick

    monkeypatch.setattr(tick, "DUE_PAGE", 2)
    w = PlanScene(platform_engine)
    kinds = ["tasks", "events", "audit", "inbox", "workflows"]
    with platform_engine.begin() as conn:
        for kind in kinds[1:]:
            store.add_policy_revision(conn, w.ns, kind, 7 * DAY, "test")
    for i, kind in enumerate(kinds):
        w.set(kind)
        w.move_next_run(dt.timedelta(minutes=10 - i), kind)  # tasks, events are the oldest
    with platform_engine.begin() as conn:
        for kind in kinds[:2]:  # the two oldest stay due forever: policy unconfirmed
            store.add_policy_revision(conn, w.ns, kind, 9 * DAY, "admin")
    report = run_tick(platform_engine, settings(), publisher)
    assert sorted(k for _, k in report.policy_unconfirmed) == ["events", "tasks"]
    assert sorted(k for _, k, _ in report.jobs_created) == ["audit", "inbox", "workflows"]


@pytest.mark.mariadb
def test_unreachable_database_is_a_transient_error(
    publisher: Publisher, caplog: pytest.LogCaptureFixture
) -> None:
    from orbit_tasks.db.engine import make_engine
    from orbit_tasks.errors import TransientError

    engine = make_engine("mysql+mysqldb://root@127.0.0.1:1/nothing")
    try:
        with caplog.at_level("WARNING"), pytest.raises(TransientError):
            run_tick(engine, settings(), publisher)
    finally:
        engine.dispose()
    failed = [r for r in caplog.records if getattr(r, "action", "") == "archive.tick.failed"]
    assert failed and failed[0].fields["stage"] == "plans"  # type: ignore[attr-defined]
    assert "127.0.0.1" not in failed[0].getMessage()  # no raw exception text


@pytest.mark.mariadb
@pytest.mark.redis
def test_unreachable_broker_is_transient_and_the_next_tick_publishes(
    platform_engine: Engine, publisher: Publisher, rds: redis.Redis
) -> None:
    from orbit_tasks.errors import TransientError

    w = PlanScene(platform_engine)
    w.set()
    dead = Celery("orbit-test-dead", broker="redis://127.0.0.1:1/0", set_as_current=False)
    dead.conf.broker_connection_retry_on_startup = False
    try:
        with pytest.raises(TransientError, match="broker"):
            run_tick(platform_engine, settings(), make_publisher(dead))
    finally:
        dead.close()
    (job,) = w.jobs()  # the job creation committed before the publish failed
    report = run_tick(platform_engine, settings(), publisher)
    assert report.jobs_created == [] and report.wakeups_published == 1
    assert bytes(job.id).hex() in rds.lindex(queue_name(w.storage), 0).decode()  # type: ignore[union-attr]


@pytest.mark.mariadb
def test_job_creation_compare_and_set_refuses_every_stale_view(platform_engine: Engine) -> None:
    w = PlanScene(platform_engine)
    seen = w.set().plan

    def try_create(view: plan_store.Plan) -> bytes | None:
        job_id = new_id()
        try:
            with platform_engine.begin() as conn:
                now = db_now(conn)
                write = plan_store.TickWrite(view, now + dt.timedelta(days=1), job_id)
                plan_store.write_tick(conn, [write], now)
        except plan_store.TickConflict:
            return None
        return job_id

    w.set(batch_size=5)  # operator change: revision moved on
    assert try_create(seen) is None
    seen = w.plan()
    w.move_next_run(dt.timedelta(minutes=1))  # another tick moved next_run_at
    assert try_create(seen) is None
    seen = w.plan()
    w.set(enabled=False)
    assert try_create(dataclasses.replace(w.plan(), enabled=True)) is None  # disabled in the row
    w.set(enabled=True)
    seen = w.plan()
    assert try_create(seen) is not None
    assert try_create(seen) is None  # the same view twice: the second loses (active job set)
    assert len(w.jobs()) == 1 and w.plan().revision == seen.revision


@pytest.mark.mariadb
def test_operator_change_racing_a_tick_keeps_the_ticks_next_run(platform_engine: Engine) -> None:
    """A plan change that does not enable the plan leaves next_run_at alone: a tick that moved it
    (and created a job) while the change waited for the row lock must not be undone."""
    w = PlanScene(platform_engine)
    w.set()
    seen = w.plan()
    tick_conn = platform_engine.connect()
    tick_tx = tick_conn.begin()
    now = db_now(tick_conn)
    advanced = schedule.next_after(seen.next_run_at, seen.interval_seconds, now)
    write = plan_store.TickWrite(seen, advanced, new_id())
    plan_store.write_tick(tick_conn, [write], now)  # the row lock is held until the commit
    errors: list[BaseException] = []

    def change() -> None:
        try:
            w.set(batch_size=9)  # reads the committed row (old next_run_at), then waits
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=change)
    t.start()
    t.join(timeout=1.0)  # the operator's UPDATE is blocked on the tick's row lock
    tick_tx.commit()
    tick_conn.close()
    t.join(timeout=30)
    assert not t.is_alive() and not errors, errors
    plan = w.plan()
    assert plan.batch_size == 9 and plan.active_job_id is not None
    assert plan.next_run_at == advanced  # the tick's advance survives
    assert len(w.jobs()) == 1


@pytest.mark.mariadb
def test_the_tick_task_with_the_database_down_is_one_warning_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Celery task (run through Celery's tracer, as a worker runs it): the tick's one
    WARNING line, and Celery's own line about the task without a traceback or ERROR level."""
    from orbit_tasks.archive import tasks
    from tests.support.cli import _reset_process_state

    monkeypatch.setenv("ORBIT_DATABASE_URL", "mysql+mysqldb://root@127.0.0.1:1/nothing")
    _reset_process_state()
    try:
        with caplog.at_level("INFO"):
            result = tasks.tick.apply()
    finally:
        monkeypatch.undo()
        _reset_process_state()
    assert result.state == "FAILURE"
    failed = [r for r in caplog.records if getattr(r, "action", "") == "archive.tick.failed"]
    assert len(failed) == 1 and failed[0].levelname == "WARNING"
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert loud == [], [(r.name, r.getMessage()) for r in loud]
