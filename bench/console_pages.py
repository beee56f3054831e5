"""Server time of each page of ``orbit console serve`` with 100,000 jobs and 1,000,000 outbox
rows (issue 29 item 6; NOT a test).

Real MariaDB (two throw-away databases) and the test Redis (ORBIT_TEST_REDIS, db 6) as the
broker. The jobs are one namespace's (the jobs list pages through all of them by keyset), 2%
each PENDING, RUNNING, FAILED and ABANDONED, the rest SUCCEEDED; the outbox rows are
bench/metrics_scrape.py's (1% REVIEW). Each page is requested ``--repeat`` times over HTTP on
the loopback by a signed-in operator: the time measured is the server's plus one loopback
round trip. The fleet page is measured cold (the exporter's first snapshot) and warm (inside
its cache window). Writes bench/console_pages.json.

    .venv/bin/python bench/console_pages.py [--jobs 100000] [--outbox 1000000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, insert, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.metrics_scrape import seed_outbox  # noqa: E402
from orbit_tasks.console import access  # noqa: E402
from orbit_tasks.console import store as console_store  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans  # noqa: E402
from orbit_tasks.ids import new_id  # noqa: E402
from orbit_tasks.platform import store as platform_store  # noqa: E402
from tests.support.console import csrf_of, running_console  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine, redis_url  # noqa: E402

MIB = 1024 * 1024
KINDS = ("tasks", "events", "audit")
CHUNK = 5000
PASSWORD = "bench-password-123"
TARGET_MS = 200.0


def seed_platform(engine: Engine, jobs: int) -> tuple[str, bytes]:
    """One namespace ``bench`` with ``jobs`` jobs over 4 storages and 3 kinds, their plans."""
    with engine.begin() as conn:
        ns = platform_store.create_namespace(conn, "bench")
        storages = [new_id() for _ in range(4)]
        for s in storages:
            platform_store.register_storage(conn, s, f"volume {s.hex()[:6]}")
        now = db_now(conn)
        conn.execute(
            insert(archive_plans),
            [
                dict(namespace_id=ns, kind=k, revision=1, enabled=True, policy_revision=1,
                     storage_id=storages[i], interval_seconds=3600, batch_size=100,
                     max_bytes=MIB, next_run_at=now, created_at=now, updated_at=now)
                for i, k in enumerate(KINDS)
            ],
        )  # fmt: skip
        console_store.add_user(
            conn, "bench", access.Role.OPERATOR, access.hash_secret(PASSWORD), "bench"
        )
    last = b""
    for start in range(0, jobs, CHUNK):
        rows = []
        for i in range(start, min(jobs, start + CHUNK)):
            state = {0: "PENDING", 1: "RUNNING", 2: "FAILED", 3: "ABANDONED"}.get(i % 50)
            state = state or "SUCCEEDED"
            at = now - dt.timedelta(minutes=jobs - i)
            last = new_id()
            rows.append(
                dict(namespace_id=ns, id=last, kind=KINDS[i % 3], plan_revision=1,
                     policy_revision=1, storage_id=storages[i % 4], batch_size=100,
                     max_bytes=MIB, state=state, revision=1,
                     attempts=1, batches=3, roots=250, bytes=4096,
                     last_sha256="ab" * 32 if state != "PENDING" else "",
                     error_code="IO_ERROR" if state == "FAILED" else "",
                     lease_id=new_id() if state == "RUNNING" else None,
                     lease_until=now + dt.timedelta(minutes=5) if state == "RUNNING" else None,
                     created_at=at, updated_at=at)
            )  # fmt: skip
        with engine.begin() as conn:
            conn.execute(insert(archive_jobs), rows)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE TABLE orbit_archive_jobs")).all()
    return "bench", last


def ms(client: httpx.Client, path: str, repeat: int) -> dict[str, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        answer = client.get(path)
        times.append((time.perf_counter() - start) * 1000)
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--outbox", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with (
        mariadb_database("orbit_bcp") as purl,
        migrated_engine(purl, "platform") as platform,
        mariadb_database("orbit_bcb") as burl,
        migrated_engine(burl, "business") as business,
    ):
        started = time.monotonic()
        ns, last_job = seed_platform(platform, args.jobs)
        seed_outbox(business, args.outbox)
        with business.begin() as conn:
            conn.execute(text("ANALYZE TABLE sender_outbox")).all()
        seeded = time.monotonic() - started
        env = {
            "ORBIT_DATABASE_URL": purl,
            "ORBIT_SENDER_DATABASE_URL": burl,
            "CELERY_BROKER_URL": redis_url(6),
            "ORBIT_LOG_LEVEL": "WARNING",
            "ORBIT_METRICS_CACHE_SECONDS": "60",
        }
        with running_console(env) as console:
            client = httpx.Client(base_url=console.base_url, timeout=120.0)
            token = csrf_of(client.get("/login").text)
            client.post("/login", data={"csrf": token, "name": "bench", "password": PASSWORD})
            start = time.perf_counter()
            assert client.get("/").status_code == 200
            fleet_cold = round((time.perf_counter() - start) * 1000, 1)
            deep = client.get(f"/jobs?namespace={ns}")
            cursor = None
            for _ in range(20):  # the 21st page: the keyset goes deep without an OFFSET
                found = deep.text.split("after=")
                cursor = found[1].split('"')[0].replace("&amp;", "&") if len(found) > 1 else None
                if cursor is None:
                    break
                deep = client.get(f"/jobs?namespace={ns}&after={cursor}")
            pages: dict[str, str] = {
                "fleet_warm": "/",
                "plans": "/plans",
                "jobs_first_page": f"/jobs?namespace={ns}",
                "jobs_page_21": f"/jobs?namespace={ns}&after={cursor}",
                "jobs_failed": f"/jobs?namespace={ns}&state=FAILED",
                "jobs_kind_storage": f"/jobs?namespace={ns}&kind=events",
                "job": f"/jobs/{ns}/{last_job.hex()}",
                "job_json": f"/api/jobs/{ns}/{last_job.hex()}",
                "dead_letters": "/dead-letters",
                "dead_letters_code": "/dead-letters?code=REJECTED",
                "audit": "/audit",
            }
            result: dict[str, Any] = {
                "jobs": args.jobs,
                "outbox_rows": args.outbox,
                "seed_seconds": round(seeded, 1),
                "fleet_cold_ms": fleet_cold,
            }
            for name, path in pages.items():
                got = ms(client, path, args.repeat)
                result[f"{name}_median_ms"] = got["median_ms"]
                result[f"{name}_max_ms"] = got["max_ms"]
            medians = [v for k, v in result.items() if k.endswith("_median_ms")]
            result["every_page_median_within_200ms"] = all(m <= TARGET_MS for m in medians)
    result["measured_at_unix"] = int(time.time())
    (ROOT / "bench" / "console_pages.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
