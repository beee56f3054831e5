"""The exporter's reads in-process against real MariaDB (and our Redis): exact values at the
database clock, the terminal-job recount, the scrape cache (counted statements over real HTTP),
the hot query plans (EXPLAIN), and the refusal of a missing schema."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine, event, insert, select, text, update

from orbit_tasks.archive.jobs import ErrorCode
from orbit_tasks.db.business_tables import sender_outbox
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans, archive_storages
from orbit_tasks.ids import new_id
from orbit_tasks.metrics import server, store
from orbit_tasks.metrics.broker import BrokerSource
from orbit_tasks.metrics.collector import OrbitCollector
from orbit_tasks.metrics.families import Snapshot, build
from orbit_tasks.metrics.sources import BusinessSource, PlatformSource, bounded_engine
from orbit_tasks.sender import enqueue
from tests.support.cli import orbit_env, run_orbit
from tests.support.db import mariadb_database, migrated_engine, redis_url
from tests.support.metrics import HTTP_PORTS, free_port, parse, series, value

pytestmark = [pytest.mark.mariadb]

MIB = 1024 * 1024
TICK = 60


def _job(storage: bytes, kind: str, state: str, updated_at: dt.datetime, **extra: Any) -> dict:  # type: ignore[type-arg]
    # every row has every key: a multi-row insert takes its columns from the first row
    row = dict(
        namespace_id=new_id(),
        id=new_id(),
        kind=kind,
        plan_revision=1,
        policy_revision=1,
        storage_id=storage,
        batch_size=10,
        max_bytes=MIB,
        state=state,
        error_code="",
        bytes=0,
        lease_id=None,
        lease_until=None,
        created_at=updated_at - dt.timedelta(hours=1),
        updated_at=updated_at,
    )
    if state == "RUNNING":
        row["lease_id"] = os.urandom(16)
        row["lease_until"] = extra.pop("lease_until")
    row.update(extra)
    return row


def _plan(storage: bytes, next_run_at: dt.datetime, enabled: bool) -> dict:  # type: ignore[type-arg]
    return dict(
        namespace_id=new_id(),
        kind="events",
        revision=1,
        enabled=enabled,
        policy_revision=1,
        storage_id=storage,
        interval_seconds=3600,
        batch_size=10,
        max_bytes=MIB,
        next_run_at=next_run_at,
        created_at=next_run_at,
        updated_at=next_run_at,
    )


def _register(engine: Engine, *storages: bytes) -> None:
    with engine.begin() as conn:
        conn.execute(insert(archive_storages), [dict(storage_id=s, label="") for s in storages])


def _read(source: PlatformSource) -> dict:  # type: ignore[type-arg]
    reading = source.read()
    registry = CollectorRegistry(auto_describe=False)

    class Fixed:
        def collect(self) -> Any:
            return iter(build(Snapshot(reading, None, None, business_configured=False)))

    registry.register(Fixed())  # type: ignore[arg-type]
    return parse(generate_latest(registry).decode())


def test_platform_reading_counts_every_state_at_the_database_clock(
    platform_engine: Engine,
) -> None:
    a, b, c = new_id(), new_id(), new_id()
    _register(platform_engine, a, b, c)
    with platform_engine.begin() as conn:
        now = db_now(conn)
        s = dt.timedelta(seconds=1)
        conn.execute(
            insert(archive_jobs),
            [
                _job(a, "events", "PENDING", now - 100 * s),
                _job(a, "events", "PENDING", now - 50 * s),
                _job(a, "events", "RUNNING", now - 30 * s, lease_until=now - 10 * s, bytes=7),
                _job(a, "events", "RUNNING", now - 30 * s, lease_until=now + 60 * s),
                *(_job(a, "events", "SUCCEEDED", now - 3600 * s, bytes=100) for _ in range(3)),
                _job(a, "events", "FAILED", now, error_code="CHAIN_BROKEN"),
                _job(a, "events", "FAILED", now, error_code="DISK_FULL", bytes=5),
                _job(a, "events", "ABANDONED", now - 10 * s),
                _job(a, "audit", "SUCCEEDED", now - 5 * s, bytes=50),
                _job(b, "tasks", "FAILED", now, error_code="STALLED"),
                _job(b, "tasks", "RUNNING", now, lease_until=now - s),
            ],
        )
        conn.execute(
            insert(archive_plans),
            [
                _plan(a, now - (2 * TICK + 1) * s, True),  # overdue
                _plan(a, now - s, True),  # due, but within two ticks
                _plan(a, now - 86400 * s, False),  # disabled: never overdue
            ],
        )
    m = _read(PlatformSource(platform_engine, tick_seconds=TICK))
    jobs = {
        (d["storage"], d["kind"], d["state"]): v
        for d, v in ((dict(k), v) for k, v in series(m, "orbit_archive_jobs").items())
    }
    expect = {
        (a, "events"): dict(PENDING=2, RUNNING=2, SUCCEEDED=3, FAILED=2, ABANDONED=1),
        (a, "audit"): dict(PENDING=0, RUNNING=0, SUCCEEDED=1, FAILED=0, ABANDONED=0),
        (b, "tasks"): dict(PENDING=0, RUNNING=1, SUCCEEDED=0, FAILED=1, ABANDONED=0),
    }
    assert jobs == {
        (st.hex(), kind, state): n for (st, kind), by in expect.items() for state, n in by.items()
    }  # all five states for each (storage, kind) that exists, zeros included; none for c
    failed = {
        (dict(k)["storage"], dict(k)["error_code"]): v
        for k, v in series(m, "orbit_archive_jobs_failed").items()
    }
    assert len(failed) == 3 * len(ErrorCode), sorted(
        failed
    )  # every error code of every registered storage
    assert {k: v for k, v in failed.items() if v} == {
        (a.hex(), "CHAIN_BROKEN"): 1,
        (a.hex(), "DISK_FULL"): 1,
        (b.hex(), "STALLED"): 1,
    }
    for storage, expired, overdue in ((a, 1, 1), (b, 1, 0), (c, 0, 0)):
        assert value(m, "orbit_archive_leases_expired", storage=storage.hex()) == expired
        assert value(m, "orbit_archive_plans_overdue", storage=storage.hex()) == overdue
    oldest = value(m, "orbit_archive_oldest_pending_seconds", storage=a.hex())
    assert oldest is not None and 100 <= oldest < 160, oldest
    assert value(m, "orbit_archive_oldest_pending_seconds", storage=b.hex()) == 0
    assert value(m, "orbit_archive_confirmed_bytes", storage=a.hex(), kind="events") == 312
    assert value(m, "orbit_archive_confirmed_bytes", storage=a.hex(), kind="audit") == 50


def test_terminal_jobs_are_recounted_periodically_and_added_since_the_cut(
    platform_engine: Engine,
) -> None:
    storage = new_id()
    _register(platform_engine, storage)
    clock = [1000.0]
    source = PlatformSource(
        platform_engine,
        tick_seconds=TICK,
        clock=lambda: clock[0],
        recount_seconds=600,
        settle_seconds=300,
    )

    def succeeded() -> int:
        return int(source.read().jobs.get((storage, "events", "SUCCEEDED"), 0))

    def add(state: str, age_seconds: float, **extra: Any) -> bytes:
        with platform_engine.begin() as conn:
            now = db_now(conn)
            row = _job(storage, "events", state, now - dt.timedelta(seconds=age_seconds), **extra)
            conn.execute(insert(archive_jobs).values(row))
        return row["id"]

    add("SUCCEEDED", 3600)
    add("SUCCEEDED", 10)
    assert succeeded() == 2 and source.recounts == 1
    add("SUCCEEDED", 0)  # after the cut: found by the index range, no recount
    running = add("RUNNING", 0, lease_until=dt.datetime(2100, 1, 1))
    assert succeeded() == 3 and source.recounts == 1
    with platform_engine.begin() as conn:  # the running job finishes: counted exactly once
        conn.execute(
            update(archive_jobs)
            .where(archive_jobs.c.id == running)
            .values(state="SUCCEEDED", lease_id=None, lease_until=None, updated_at=db_now(conn))
        )
    assert succeeded() == 4 and source.recounts == 1
    # A job that committed late with an updated_at before the cut is missed until the next
    # recount (docs/metrics.md: the cut trails the clock by 300 s so that this needs a
    # transaction longer than that).
    add("SUCCEEDED", 400)
    assert succeeded() == 4
    clock[0] += 600
    assert succeeded() == 5 and source.recounts == 2


@contextmanager
def _counting(engine: Engine) -> Iterator[list[str]]:
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


@pytest.mark.redis
def test_scrapes_inside_the_cache_window_cost_one_read(mariadb_url: str) -> None:
    with (
        migrated_engine(mariadb_url, "platform"),
        mariadb_database("orbit_mb") as business_url,
        migrated_engine(business_url, "business"),
    ):
        platform = PlatformSource(bounded_engine(mariadb_url, 5), tick_seconds=TICK)
        business = BusinessSource(bounded_engine(business_url, 5))
        _register(platform.engine, new_id())
        with business.engine.begin() as conn:
            ids = dict(namespace_id=secrets.token_hex(16), queue_id=secrets.token_hex(16))
            enqueue(conn, **ids, operation_id=secrets.token_hex(16), request="{}", source_ref="r")
        app = Celery("metrics-test", broker=redis_url(5))
        clock = [0.0]
        collector = OrbitCollector(
            platform,
            business,
            BrokerSource(app, timeout=5, reply_seconds=0.5),
            cache_seconds=15,
            timeout=5,
            clock=lambda: clock[0],
        )
        running = server.start(collector, "127.0.0.1", free_port(HTTP_PORTS))
        url = f"http://127.0.0.1:{running.port}/metrics"
        try:
            with _counting(platform.engine) as p_sql, _counting(business.engine) as b_sql:
                first = parse(httpx.get(url, timeout=30).text)
                one_read = (len(p_sql), len(b_sql))
                # see PlatformSource/BusinessSource (8: the enabled plans of the backlog gauge;
                # no enabled plan here, so no range and probe statements; 9: the beat leader;
                # 10: the namespaces' names, issue 27)
                assert one_read == (10, 5), (p_sql, b_sql)
                clock[0] = 14.9  # still inside the window
                second = parse(httpx.get(url, timeout=30).text)
                assert (len(p_sql), len(b_sql)) == one_read
                assert collector.refreshes == 1
                assert value(second, "orbit_up", source="platform_db") == 1
                assert series(second, "orbit_archive_leases_expired") == series(
                    first, "orbit_archive_leases_expired"
                )
                clock[0] = 15.0  # the window has passed: concurrent scrapes share one read
                threads = [
                    threading.Thread(target=httpx.get, args=(url,), kwargs={"timeout": 30})
                    for _ in range(4)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert collector.refreshes == 2
                assert len(b_sql) == 2 * one_read[1]
                # the platform's second read has no recount (the terminal-jobs scan)
                assert sum("updated_at <=" in s for s in p_sql) == 1
        finally:
            running.stop()
            app.close()
            platform.engine.dispose()
            business.engine.dispose()


def _explain(conn: Any, query: Any) -> dict:  # type: ignore[type-arg]
    compiled = query.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    args = tuple(params[k] for k in compiled.positiontup)
    rows = conn.exec_driver_sql("EXPLAIN " + compiled.string, args).mappings().all()
    assert len(rows) == 1, rows
    return dict(rows[0])


def test_hot_queries_use_their_indexes(platform_engine: Engine, business_engine: Engine) -> None:
    """Realistic proportions: most jobs finished, most outbox rows ACCEPTED (with a third of
    the rows unfinished, a table scan would be the cheaper plan and the optimizer takes it)."""
    storages = [new_id() for _ in range(8)]
    _register(platform_engine, *storages)
    with platform_engine.begin() as conn:
        now = db_now(conn)
        jobs, plans = [], []
        for i in range(2000):
            storage = storages[i % 8]
            state = {0: "PENDING", 1: "RUNNING", 2: "FAILED", 3: "ABANDONED"}.get(i % 50)
            extra = {"lease_until": now + dt.timedelta(seconds=i - 1000)} if i % 50 == 1 else {}
            jobs.append(
                _job(storage, ("tasks", "events", "audit")[i % 3], state or "SUCCEEDED",
                     now - dt.timedelta(seconds=10 * i), **extra)
            )  # fmt: skip
            plans.append(_plan(storage, now + dt.timedelta(minutes=i - 200), i % 3 != 0))
        conn.execute(insert(archive_jobs), jobs)
        conn.execute(insert(archive_plans), plans)
    with platform_engine.connect() as conn:
        conn.execute(text("ANALYZE TABLE orbit_archive_plans, orbit_archive_jobs")).all()
        active = _explain(conn, store.active_jobs_query(storages, now))
        assert (active["key"], active["type"]) == ("ix_archive_job_claim", "range"), active
        recent = _explain(conn, store.terminal_since_query(storages, now))
        assert (recent["key"], recent["type"]) == ("ix_archive_job_claim", "range"), recent
        # the range runs over the whole index: storage, state, lease_until IS NULL, updated_at
        assert int(recent["key_len"]) == 16 + (16 * 4 + 2) + (8 + 1) + 8, recent
        overdue = _explain(conn, store.overdue_plans_query(storages, now))
        assert (overdue["key"], overdue["type"]) == ("ix_archive_plan_due", "range"), overdue
        assert "Using index" in overdue["Extra"]
    digest = hashlib.sha256(b"{}").digest()
    namespaces = [secrets.token_hex(16) for _ in range(3)]
    queues = [secrets.token_hex(16) for _ in range(4)]
    with business_engine.begin() as conn:
        now = db_now(conn)
        rows = []
        for i in range(3000):
            state = {0: "PENDING", 1: "SENDING", 2: "REVIEW"}.get(i % 100, "ACCEPTED")
            active_row = state in ("PENDING", "SENDING")
            rows.append(
                dict(
                    namespace_id=namespaces[i % 3],
                    queue_id=queues[i % 4],
                    operation_id=secrets.token_hex(16),
                    idempotency_key="op-" + secrets.token_hex(16),
                    request_json="{}",
                    request_digest=digest,
                    state=state,
                    send_count=0 if state == "PENDING" else 1,
                    lease_epoch=0 if state == "PENDING" else 1,
                    wake_at=now if active_row else None,
                    send_deadline_at=now + dt.timedelta(hours=20),
                    last_code="NEW",
                    task_id=secrets.token_hex(16) if state == "ACCEPTED" else None,
                    receipt_json="{}" if state == "ACCEPTED" else None,
                    created_at=now,
                    updated_at=now,
                )
            )
        conn.execute(insert(sender_outbox), rows)
    with business_engine.connect() as conn:
        conn.execute(text("ANALYZE TABLE sender_outbox")).all()
        pairs = store.outbox_pairs(conn)
        assert len(pairs) == 12
        loose = _explain(
            conn,
            select(sender_outbox.c.namespace_id, sender_outbox.c.queue_id).group_by(
                sender_outbox.c.namespace_id, sender_outbox.c.queue_id
            ),
        )
        assert loose["key"] == "ix_sender_due" and "for group-by" in loose["Extra"], loose
        active = _explain(conn, store.active_outbox_query(pairs, now))
        assert (active["key"], active["type"]) == ("ix_sender_due", "range"), active


def test_exporter_refuses_a_missing_schema(tmp_path: Path) -> None:
    with mariadb_database("orbit_me") as empty:
        env = orbit_env(empty, ORBIT_VAR_DIR=str(tmp_path / "var"))
        proc = run_orbit(["metrics", "serve", "--port", str(free_port(HTTP_PORTS))], env)
        assert proc.returncode == 1, proc
        line = proc.stderr.strip().splitlines()
        assert len(line) == 1 and line[0].startswith("error: platform database: table "), line
        assert "is missing" in line[0] and line[0].endswith("run `orbit db upgrade`"), line
        with migrated_engine(empty, "platform"), mariadb_database("orbit_me") as empty_business:
            env = orbit_env(empty, empty_business, ORBIT_VAR_DIR=str(tmp_path / "var"))
            proc = run_orbit(["metrics", "serve", "--port", str(free_port(HTTP_PORTS))], env)
            assert proc.returncode == 1, proc
            assert "business database: table sender_" in proc.stderr
            assert "is missing" in proc.stderr
            assert "run `orbit sender db upgrade`" in proc.stderr


def test_bad_port_and_settings_are_refused_in_one_line(mariadb_url: str) -> None:
    env = orbit_env(mariadb_url)
    proc = run_orbit(["metrics", "serve", "--port", "70000"], env)
    assert proc.returncode == 2 and "70000" in proc.stderr and "allowed 1..65535" in proc.stderr
    proc = run_orbit(["metrics", "serve"], {**env, "ORBIT_METRICS_CACHE_SECONDS": "-1"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (  # issue 27: no sign (ASCII digits and a unit, units.py)
        "error: ORBIT_METRICS_CACHE_SECONDS='-1' is not a duration (allowed 0..3600: seconds as "
        "ASCII digits, or with s, m, h or d, e.g. 90s or 2m; no sign, no spaces)"
    )
    proc = run_orbit(["metrics", "serve"], {**env, "ORBIT_METRICS_TIMEOUT_SECONDS": "0.1"})
    assert proc.returncode == 2 and "ORBIT_METRICS_TIMEOUT_SECONDS=0.1" in proc.stderr
