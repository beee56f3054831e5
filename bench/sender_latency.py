"""Enqueue -> ACCEPTED latency, with and without the after-commit wake-up (NOT a test).

One real ``orbit worker sender`` (prefork, 2 children) and one real ``orbit beat`` (the default
2 s sender tick) on Redis, the reference API subprocess on loopback, MariaDB platform and
business databases. Submissions are made one at a time: commit one ``enqueue()``, wait until its
row is ACCEPTED, then the next. The latency of a row is ``updated_at - created_at`` of the
ACCEPTED row, both on the database clock (``created_at`` is read inside the enqueueing
transaction, so the commit is included). The same run is made with
``ORBIT_SENDER_WAKE_ON_COMMIT=0`` (the tick alone). Writes bench/sender_latency.json.

    .venv/bin/python bench/sender_latency.py [--rows 200] [--rows-off 40]

Run it under ``flock /tmp/orbit-heavy.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from sqlalchemy import Engine, text  # noqa: E402

from orbit_tasks.platform import store as platform_store  # noqa: E402
from orbit_tasks.sender import enqueue  # noqa: E402
from orbit_tasks.sender.wakeup import PUBLISHER  # noqa: E402
from orbit_tasks.settings import get_settings  # noqa: E402
from tests.support.api_server import running_api_server  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine, redis_url  # noqa: E402
from tests.support.processes import Proc, started  # noqa: E402

ORBIT = str(ROOT / ".venv" / "bin" / "orbit")
REDIS_DB = 6
TARGET_P50_MS, TARGET_P99_MS = 100.0, 500.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@contextmanager
def fleet(env: dict[str, str], tmp: Path) -> Iterator[tuple[Proc, Proc]]:
    worker_cmd = [ORBIT, "worker", "sender", "--concurrency", "2", "--name", "bench-lat@%h"]
    with (
        started(worker_cmd, env, tmp / "worker.log") as worker,
        started([ORBIT, "beat"], env, tmp / "beat.log") as beat,
    ):
        deadline = time.monotonic() + 60
        while "ready." not in worker.text():
            if worker.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"sender worker did not start:\n{worker.text()}")
            time.sleep(0.2)
        yield worker, beat


def one_at_a_time(engine: Engine, ns: str, queue: str, n: int) -> tuple[list[float], list[float]]:
    """(database-clock latencies, wall-clock latencies) in ms of ``n`` sequential submissions."""
    db_ms: list[float] = []
    wall_ms: list[float] = []
    for i in range(n):
        op = secrets.token_hex(16)
        t0 = time.perf_counter()
        with engine.begin() as conn:
            enqueue(
                conn,
                namespace_id=ns,
                queue_id=queue,
                operation_id=op,
                request={"kind": "latency", "i": i},
                source_ref=f"bench/{i}",
            )
        deadline = time.monotonic() + 30
        while True:
            with engine.connect() as conn:
                row = conn.execute(
                    text(
                        "SELECT state, created_at, updated_at FROM sender_outbox "
                        "WHERE namespace_id = :ns AND operation_id = :op"
                    ),
                    {"ns": ns, "op": op},
                ).one()
            if row.state == "ACCEPTED":
                wall_ms.append((time.perf_counter() - t0) * 1000)
                db_ms.append((row.updated_at - row.created_at).total_seconds() * 1000)
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"row {op} not ACCEPTED within 30 s (state {row.state})")
            time.sleep(0.002)
    return db_ms, wall_ms


def figures(prefix: str, db_ms: list[float], wall_ms: list[float]) -> dict[str, float]:
    return {
        f"{prefix}_rows": len(db_ms),
        f"{prefix}_p50_ms": round(percentile(db_ms, 0.50), 1),
        f"{prefix}_p99_ms": round(percentile(db_ms, 0.99), 1),
        f"{prefix}_max_ms": round(max(db_ms), 1),
        f"{prefix}_mean_ms": round(statistics.mean(db_ms), 1),
        f"{prefix}_wall_p50_ms": round(percentile(wall_ms, 0.50), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200, help="submissions with the wake-up")
    parser.add_argument("--rows-off", type=int, default=40, help="submissions, tick only")
    args = parser.parse_args()
    broker = redis_url(REDIS_DB)
    redis.Redis.from_url(broker).flushdb()
    result: dict[str, object] = {}
    with (
        mariadb_database("orbit_bench_lp") as purl,
        migrated_engine(purl, "platform") as platform,
        mariadb_database("orbit_bench_lb") as burl,
        migrated_engine(burl, "business") as business,
        tempfile.TemporaryDirectory(prefix="orbit-bench-latency-") as tmpdir,
    ):
        with platform.begin() as conn:
            ns = platform_store.create_namespace(conn, "lat-" + secrets.token_hex(3))
            queue = platform_store.create_queue(conn, ns, "q0").hex()
            _, token = platform_store.create_credential(conn, ns, None)
        tmp = Path(tmpdir)
        with running_api_server(purl, log_level="warning") as api:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
            env.update(
                ORBIT_DATABASE_URL=purl,
                ORBIT_SENDER_DATABASE_URL=burl,
                CELERY_BROKER_URL=broker,
                ORBIT_API_URL=api.base_url,
                ORBIT_API_TOKEN=token,
                ORBIT_VAR_DIR=str(tmp / "var"),
            )
            # This process is the application: it publishes to the fleet's broker.
            os.environ["CELERY_BROKER_URL"] = broker
            with fleet(env, tmp):
                runs = (("1", "wake", args.rows), ("0", "tick_only", args.rows_off))
                for wake, prefix, n in runs:
                    os.environ["ORBIT_SENDER_WAKE_ON_COMMIT"] = wake
                    get_settings.cache_clear()
                    one_at_a_time(business, ns.hex(), queue, 5)  # warm-up: connections, caches
                    db_ms, wall_ms = one_at_a_time(business, ns.hex(), queue, n)
                    result.update(figures(prefix, db_ms, wall_ms))
                    print(
                        f"{prefix:>9}: p50 {result[f'{prefix}_p50_ms']} ms, p99 "
                        f"{result[f'{prefix}_p99_ms']} ms, max {result[f'{prefix}_max_ms']} ms "
                        f"({n} one at a time)",
                        flush=True,
                    )
            result["wakeups_published"] = PUBLISHER.published
    result["tick_seconds"] = 2
    result["target_p50_ms"], result["target_p99_ms"] = TARGET_P50_MS, TARGET_P99_MS
    result["measured_at_unix"] = int(time.time())
    (ROOT / "bench" / "sender_latency.json").write_text(json.dumps(result, indent=2) + "\n")
    redis.Redis.from_url(broker).flushdb()


if __name__ == "__main__":
    main()
