"""Ticks in batches (issue 8 item 5): a bounded number of statements per page of due plans,
and every SPEC §4 rule kept when other ticks or operators change plans mid-page."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine, delete, event, func, select, text, update

from orbit_tasks.archive import tick
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.tick import TickReport, run_tick
from orbit_tasks.archive.wakeups import Publisher, make_publisher
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.platform_tables import (
    archive_jobs,
    archive_plans,
    archive_policies,
    namespaces,
)
from orbit_tasks.ids import new_id
from orbit_tasks.platform import store
from orbit_tasks.settings import Settings, load_settings
from tests.support.db import redis_url
from tests.support.tick import PlanKey, make_due, race, seed_plans

REDIS_URL = redis_url(2)
MIB = 1024**2
HOUR = dt.timedelta(hours=1)


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    app = Celery("orbit-test-batches", broker=REDIS_URL, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    try:
        yield make_publisher(app)
    finally:
        app.close()
        client.flushdb()
        client.close()


def settings() -> Settings:
    return load_settings({"ORBIT_VAR_DIR": "/tmp/orbit-tick-unused"})


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """Every statement sent to the database while the block runs."""
    seen: list[str] = []

    def hook(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", hook)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", hook)


@contextmanager
def before_each(engine: Engine, prefix: str, action: Callable[[int], None]) -> Iterator[None]:
    """Run ``action(n)`` before the n-th statement (from 1) starting with ``prefix``, on the
    tick's own connection: the moment after the tick read its rows and before it writes."""
    count = [0]

    def hook(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith(prefix):
            count[0] += 1
            action(count[0])

    event.listen(engine, "before_cursor_execute", hook)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", hook)


def job_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(archive_jobs)).scalar_one())


def plan_row(engine: Engine, key: PlanKey) -> plan_store.Plan:
    with engine.connect() as conn:
        plan = plan_store.get_plan(conn, key.namespace_id, key.kind)
    assert plan is not None
    return plan


@pytest.fixture
def operator(platform_engine: Engine) -> Iterator[Engine]:
    """A second engine: the operator's statements are not the tick's (no hooks on it)."""
    engine = make_engine(platform_engine.url.render_as_string(False))
    try:
        yield engine
    finally:
        engine.dispose()


def operator_change(engine: Engine, key: PlanKey, batch_size: int) -> None:
    """``orbit plan set NS KIND --batch-size N`` in its own transaction."""
    with engine.begin() as conn:
        plan_store.set_plan(
            conn,
            key.namespace_id,
            key.kind,
            storage_id=None,
            interval=None,
            batch_size=batch_size,
            max_bytes=None,
            policy_revision=None,
            enabled=None,
            expect_revision=None,
            now=db_now(conn),
            actor="operator",
        )


# --- statements per page --------------------------------------------------------------------


def _mixed_due_plans(engine: Engine, storage: bytes, count: int) -> None:
    """``count`` due plans with every outcome on one page: new jobs, one coalesced (active
    job), one policy unconfirmed, and a disabled namespace (its plans are skipped)."""
    with engine.connect() as conn:
        now = db_now(conn)
    keys = seed_plans(engine, storage, count, now=now)
    make_due(engine, keys, now - 5 * HOUR)
    with engine.begin() as conn:
        conn.execute(
            update(archive_plans)
            .where(
                archive_plans.c.namespace_id == keys[1].namespace_id,
                archive_plans.c.kind == keys[1].kind,
            )
            .values(active_job_id=new_id())
        )
        conn.execute(
            archive_policies.insert().values(
                namespace_id=keys[2].namespace_id,
                kind=keys[2].kind,
                revision=2,
                archive_after_seconds=9 * 86400,
                created_by="admin",
            )
        )
        store.set_namespace_state(conn, keys[-1].namespace_id, "DISABLED")


def _clear(engine: Engine) -> None:
    with engine.begin() as conn:
        for table in (archive_jobs, archive_plans, archive_policies, namespaces):
            conn.execute(delete(table))


def test_statements_per_tick_page_do_not_grow_with_due_plans(
    any_platform_url: str, publisher: Publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(any_platform_url)
    storage = new_id()
    counts: dict[int, list[str]] = {}
    reports: dict[int, TickReport] = {}
    try:
        for due in (8, 150):
            _clear(engine)
            _mixed_due_plans(engine, storage, due)
            with statements(engine) as seen:
                reports[due] = run_tick(engine, settings(), publisher)
            counts[due] = seen
        # Several pages: the count grows with pages, never with plans.
        _clear(engine)
        monkeypatch.setattr(tick, "DUE_PAGE", 40)
        _mixed_due_plans(engine, storage, 150)
        with statements(engine) as paged:
            paged_report = run_tick(engine, settings(), publisher)
    finally:
        engine.dispose()

    small, large = reports[8], reports[150]
    disabled_small, disabled_large = 1, 150 - 147  # plans of the last (disabled) namespace
    assert len(small.jobs_created) == 8 - 2 - disabled_small
    assert len(large.jobs_created) == 150 - 2 - disabled_large
    for report, disabled in ((small, disabled_small), (large, disabled_large)):
        assert len(report.coalesced) == 1 and len(report.policy_unconfirmed) == 1
        assert len(report.namespace_inactive) == disabled and report.lost == 0
    assert len(counts[150]) == len(counts[8]), (counts[8], counts[150])
    # clock + storages + pauses + windows (the sweep leaves closed ones out), 6 per page
    # (clock, scan, states, policies, UPDATE, INSERT), the replica heartbeat 1, sweep 3, the
    # scrub's wake-up per storage 3 (clock, its scrub lease, its first due job; issue 28); SQLite
    # adds its BEGIN IMMEDIATE per transaction.
    assert len(counts[8]) <= 22, counts[8]
    assert sum("orbit_archive_heartbeat" in s for s in counts[150]) == 1
    assert len(paged_report.jobs_created) == len(large.jobs_created)
    scans = [s for s in paged if "FROM orbit_archive_plans" in s and "next_run_at <=" in s]
    assert len(scans) == 4  # pages of 40, 40, 40, 30
    assert len(paged) <= len(counts[150]) + 3 * 7, paged


# --- conflicts: another writer between the tick's read and its write ---------------------------


@pytest.mark.mariadb
def test_operator_change_between_scan_and_write_rolls_the_page_back_and_rescans(
    platform_engine: Engine,
    operator: Engine,
    publisher: Publisher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    e = platform_engine
    storage = new_id()
    with e.connect() as conn:
        now = db_now(conn)
    keys = seed_plans(e, storage, 20, now=now)
    make_due(e, keys, now - HOUR)
    victim = keys[5]

    def change(n: int) -> None:
        if n == 1:  # the page's compare-and-set UPDATE is about to run
            operator_change(operator, victim, 7)

    with caplog.at_level(logging.INFO), before_each(e, "UPDATE ORBIT_ARCHIVE_PLANS", change):
        report = run_tick(e, settings(), publisher)
    actions = [getattr(r, "action", "") for r in caplog.records]
    assert actions.count("archive.tick.page_conflict") == 1
    assert len(report.jobs_created) == 20 and report.lost == 0
    assert job_count(e) == 20
    plan = plan_row(e, victim)
    assert (plan.revision, plan.batch_size) == (2, 7)  # the operator's change stands
    assert plan.next_run_at > now and plan.active_job_id is not None
    with e.connect() as conn:
        job = conn.execute(
            select(archive_jobs).where(archive_jobs.c.id == plan.active_job_id)
        ).one()
    assert (job.plan_revision, job.batch_size) == (2, 7)  # decided on the row as changed


@pytest.mark.mariadb
def test_a_page_that_keeps_conflicting_goes_plan_by_plan_and_counts_lost_plans(
    platform_engine: Engine, operator: Engine, publisher: Publisher
) -> None:
    e = platform_engine
    storage = new_id()
    with e.connect() as conn:
        now = db_now(conn)
    keys = seed_plans(e, storage, 12, now=now)
    make_due(e, keys, now - HOUR)
    first = keys[7]
    make_due(e, [first], now - 2 * HOUR)  # the oldest: the first plan handled one by one

    def change(n: int) -> None:
        # Three page attempts conflict, then the first single-plan compare-and-set loses too.
        if n <= tick.PAGE_ATTEMPTS:
            operator_change(operator, keys[n], 10 + n)
        elif n == tick.PAGE_ATTEMPTS + 1:
            operator_change(operator, first, 50)

    with before_each(e, "UPDATE ORBIT_ARCHIVE_PLANS", change):
        report = run_tick(e, settings(), publisher)
    assert report.lost == 1
    assert len(report.jobs_created) == 11 and job_count(e) == 11
    assert plan_row(e, first).active_job_id is None  # lost: no job this tick, still due
    for n in range(1, tick.PAGE_ATTEMPTS + 1):
        assert plan_row(e, keys[n]).batch_size == 10 + n
    again = run_tick(e, settings(), publisher)
    assert [(ns, k) for ns, k, _ in again.jobs_created] == [(first.namespace_id.hex(), first.kind)]
    assert plan_row(e, first).batch_size == 50 and job_count(e) == 12


@pytest.mark.mariadb
def test_three_racing_ticks_over_many_pages_create_exactly_one_job_per_due_plan(
    platform_engine: Engine, publisher: Publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tick, "DUE_PAGE", 25)
    e = platform_engine
    storages = [new_id(), new_id()]
    with e.connect() as conn:
        now = db_now(conn)
    keys = [
        k for i, s in enumerate(storages) for k in seed_plans(e, s, 150, now=now, prefix=f"s{i}")
    ]
    for _round in range(2):
        with e.connect() as conn:
            now = db_now(conn)
        make_due(e, keys, now - HOUR)
        before = job_count(e)
        reports = race(lambda: run_tick(e, settings(), publisher), 3)
        created = [(ns, k) for r in reports for ns, k, _ in r.jobs_created]
        assert len(created) == len(set(created)) == len(keys)
        assert job_count(e) - before == len(keys)
        with e.connect() as conn:
            active = conn.execute(
                select(func.count()).where(archive_plans.c.active_job_id.is_not(None))
            ).scalar_one()
        assert active == len(keys)


# --- EXPLAIN: the page's set-based statements use the primary keys ------------------------------


def _explain(
    conn: Any, statement: Any, values: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params(values)
    args = tuple(params[k] for k in compiled.positiontup)
    return [dict(r) for r in conn.exec_driver_sql("EXPLAIN " + compiled.string, args).mappings()]


@pytest.mark.mariadb
def test_explain_page_statements_use_primary_keys(platform_engine: Engine) -> None:
    e = platform_engine
    storage = new_id()
    with e.connect() as conn:
        now = db_now(conn)
    keys = seed_plans(e, storage, 3000, now=now)
    with e.connect() as conn:
        conn.execute(
            text("ANALYZE TABLE orbit_archive_plans, orbit_namespaces, orbit_archive_policies")
        ).all()
        page = [plan_row(e, k) for k in keys[100:300:2]]
        ns_ids = {p.namespace_id for p in page}
        pairs = {(p.namespace_id, p.kind) for p in page}
        writes = [
            plan_store.TickWrite(p, now + HOUR, new_id() if i % 2 else None)
            for i, p in enumerate(page)
        ]
        for statement, values in (
            (plan_store.namespace_states_query(ns_ids), None),
            (plan_store.latest_policies_query(pairs), None),
            plan_store.tick_update_statement(writes),
        ):
            (row,) = _explain(conn, statement, values)
            assert row["key"] == "PRIMARY", row
            assert row["type"] == "range", row
            assert "filesort" not in str(row["Extra"]), row
            assert int(row["rows"]) <= 2 * len(page), row
