"""Scrape time of ``orbit metrics serve`` with 10k archive jobs and 100k outbox rows (NOT a test).

Real MariaDB (two throw-away databases) and the test Redis (ORBIT_TEST_REDIS, db 6). Measures,
in one run:
- each source's read: the platform database cold (with the terminal-jobs recount) and warm (the
  index ranges only), the business database, the broker probe (its reply window dominates);
- the alternative the platform read replaces: one GROUP BY over the whole jobs table per read;
- scrapes over HTTP through the real exporter server: the first (cold), uncached (cache 0, every
  source read in parallel) and cached (inside ORBIT_METRICS_CACHE_SECONDS).
Writes bench/metrics_scrape.json.

    .venv/bin/python bench/metrics_scrape.py [--jobs 10000] [--outbox 100000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from celery import Celery
from sqlalchemy import Engine, func, insert, select, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orbit_tasks.db.business_tables import sender_outbox  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.db.platform_tables import (  # noqa: E402
    archive_jobs,
    archive_plans,
    archive_storages,
)
from orbit_tasks.ids import new_id  # noqa: E402
from orbit_tasks.metrics import server  # noqa: E402
from orbit_tasks.metrics.broker import BrokerSource  # noqa: E402
from orbit_tasks.metrics.collector import OrbitCollector  # noqa: E402
from orbit_tasks.metrics.sources import (  # noqa: E402
    BusinessSource,
    PlatformSource,
    bounded_engine,
)
from tests.support.db import mariadb_database, migrated_engine, redis_url  # noqa: E402
from tests.support.metrics import HTTP_PORTS, free_port  # noqa: E402

MIB = 1024 * 1024
KINDS = ("tasks", "events", "audit")
CHUNK = 5000


def seed_platform(engine: Engine, jobs: int, storages: list[bytes]) -> None:
    """``jobs`` jobs over the storages and kinds: 2% each PENDING, RUNNING, FAILED and ABANDONED,
    the rest SUCCEEDED."""
    with engine.begin() as conn:
        conn.execute(insert(archive_storages), [dict(storage_id=s, label="") for s in storages])
        now = db_now(conn)
        plans = [
            dict(namespace_id=new_id(), kind=KINDS[i % 3], revision=1, enabled=True,
                 policy_revision=1, storage_id=storages[i % len(storages)],
                 interval_seconds=3600, batch_size=100, max_bytes=MIB,
                 next_run_at=now + dt.timedelta(minutes=i % 60), created_at=now, updated_at=now)
            for i in range(max(1, jobs // 20))
        ]  # fmt: skip
        conn.execute(insert(archive_plans), plans)
    rows = []
    for i in range(jobs):
        state = {0: "PENDING", 1: "RUNNING", 2: "FAILED", 3: "ABANDONED"}.get(i % 50, "SUCCEEDED")
        at = now - dt.timedelta(minutes=jobs - i)
        rows.append(
            dict(namespace_id=new_id(), id=new_id(), kind=KINDS[i % 3], plan_revision=1,
                 policy_revision=1, storage_id=storages[i % len(storages)], batch_size=100,
                 max_bytes=MIB, state=state, error_code="IO_ERROR" if state == "FAILED" else "",
                 bytes=4096, lease_id=os.urandom(16) if state == "RUNNING" else None,
                 lease_until=now + dt.timedelta(minutes=1) if state == "RUNNING" else None,
                 created_at=at, updated_at=at)
        )  # fmt: skip
    for start in range(0, len(rows), CHUNK):
        with engine.begin() as conn:
            conn.execute(insert(archive_jobs), rows[start : start + CHUNK])


def seed_outbox(engine: Engine, count: int) -> None:
    """``count`` rows in 3 namespaces x 4 queues: 1% PENDING/SENDING, 1% REVIEW, the rest
    ACCEPTED (a sender that keeps up)."""
    digest = hashlib.sha256(b"{}").digest()
    namespaces = [secrets.token_hex(16) for _ in range(3)]
    queues = [secrets.token_hex(16) for _ in range(4)]
    with engine.connect() as conn:
        now = db_now(conn)
    for start in range(0, count, CHUNK):
        rows = []
        for i in range(start, min(count, start + CHUNK)):
            state = {0: "PENDING", 1: "SENDING", 2: "REVIEW"}.get(i % 100, "ACCEPTED")
            active = state in ("PENDING", "SENDING")
            rows.append(
                dict(namespace_id=namespaces[i % 3], queue_id=queues[i % 4],
                     operation_id=(op := secrets.token_hex(16)), idempotency_key="op-" + op,
                     request_json="{}", request_digest=digest, state=state,
                     send_count=0 if state == "PENDING" else 1,
                     lease_epoch=0 if state == "PENDING" else 1,
                     wake_at=now if active else None,
                     send_deadline_at=now + dt.timedelta(hours=20),
                     last_code="REJECTED" if state == "REVIEW" else "NEW",
                     task_id=secrets.token_hex(16) if state == "ACCEPTED" else None,
                     receipt_json="{}" if state == "ACCEPTED" else None,
                     created_at=now - dt.timedelta(hours=4), updated_at=now)
            )  # fmt: skip
        with engine.begin() as conn:
            conn.execute(insert(sender_outbox), rows)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    return round(statistics.median(timed(fn) for _ in range(repeat)), 2)


def naive_job_counts(engine: Engine) -> None:
    """The alternative: every (storage, kind, state) count from one scan of the jobs table."""
    j = archive_jobs.c
    with engine.connect() as conn:
        conn.execute(
            select(j.storage_id, j.kind, j.state, func.count(), func.sum(j.bytes)).group_by(
                j.storage_id, j.kind, j.state
            )
        ).all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--outbox", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    timeout = 5.0
    with (
        mariadb_database("orbit_bench_mp") as purl,
        migrated_engine(purl, "platform") as platform_engine,
        mariadb_database("orbit_bench_mb") as burl,
        migrated_engine(burl, "business") as business_engine,
    ):
        storages = [new_id() for _ in range(8)]
        seed_platform(platform_engine, args.jobs, storages)
        seed_outbox(business_engine, args.outbox)
        with platform_engine.connect() as conn:
            conn.execute(text("ANALYZE TABLE orbit_archive_jobs, orbit_archive_plans")).all()
        with business_engine.connect() as conn:
            conn.execute(text("ANALYZE TABLE sender_outbox")).all()

        app = Celery("bench-metrics", broker=redis_url(6))
        platform = PlatformSource(bounded_engine(purl, timeout), tick_seconds=60)
        business = BusinessSource(bounded_engine(burl, timeout))
        broker = BrokerSource(app, timeout=timeout, reply_seconds=server.reply_window(timeout))
        platform_cold = round(timed(platform.read), 2)
        assert platform.recounts == 1
        platform_warm = median_ms(platform.read, args.repeat)
        assert platform.recounts == 1  # warm reads never rescan the table
        naive = median_ms(lambda: naive_job_counts(platform.engine), args.repeat)
        business_ms = median_ms(business.read, args.repeat)
        broker_ms = median_ms(lambda: broker.read(lambda: tuple(storages)), 3)

        port = free_port(HTTP_PORTS)
        url = f"http://127.0.0.1:{port}/metrics"
        # one client for all scrapes, as Prometheus keeps its connection (a new httpx client
        # costs ~80 ms of its own set-up, more than a cached scrape)
        client = httpx.Client(timeout=30)
        fresh = PlatformSource(platform.engine, tick_seconds=60)
        uncached = OrbitCollector(fresh, business, broker, cache_seconds=0, timeout=timeout)
        running = server.start(uncached, "127.0.0.1", port)
        try:
            first = round(timed(lambda: client.get(url).raise_for_status()), 2)
            every = median_ms(lambda: client.get(url).raise_for_status(), 3)
        finally:
            running.stop()
        cached_collector = OrbitCollector(
            fresh, business, broker, cache_seconds=3600, timeout=timeout
        )
        running = server.start(cached_collector, "127.0.0.1", port)
        try:
            client.get(url).raise_for_status()
            cached = median_ms(lambda: client.get(url).raise_for_status(), 50)
            body = client.get(url).text
        finally:
            running.stop()
        client.close()
        app.close()
        platform.engine.dispose()
        business.engine.dispose()
    assert 'orbit_up{source="platform_db"} 1.0' in body and "orbit_outbox_rows" in body
    result = {
        "jobs": args.jobs,
        "outbox_rows": args.outbox,
        "platform_read_cold_ms": platform_cold,
        "platform_read_warm_ms": platform_warm,
        "naive_full_job_count_ms": naive,
        "naive_over_warm_platform_read": round(naive / platform_warm, 2),
        "business_read_ms": business_ms,
        "broker_probe_ms": broker_ms,
        "broker_reply_window_ms": server.reply_window(timeout) * 1000,
        "scrape_first_ms": first,
        "scrape_uncached_ms": every,
        "scrape_cached_ms": cached,
        "uncached_over_cached": round(every / cached, 1),
        "measured_at_unix": int(time.time()),
    }
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "metrics_scrape.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
