"""Archive throughput of one worker, in one run (NOT a test).

Seeds ``--roots`` settled task roots with ``--children`` attempts each into a fresh MariaDB
database, creates one archive job per measurement (batch 100 and batch 10) and measures roots/s:

* ``worker``: a real ``orbit worker archive -c 1`` process (Celery over Redis db 2, default slice
  and lease, continuation wake-ups included), from the tick's wake-up to SUCCEEDED;
* ``in_process``: the same runner called directly (no broker), for the ratio of Celery overhead.

Writes bench/archive_throughput.json.

    .venv/bin/python bench/archive_throughput.py [--roots 20000] [--children 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from sqlalchemy import Engine, update  # noqa: E402

from orbit_tasks.archive import job_store, plan_store, runner  # noqa: E402
from orbit_tasks.archive.jobs import JobState  # noqa: E402
from orbit_tasks.archive.tick import run_tick  # noqa: E402
from orbit_tasks.archive.volume import write_identity  # noqa: E402
from orbit_tasks.archive.wakeups import make_publisher  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.db.platform_tables import archive_plans  # noqa: E402
from orbit_tasks.ids import new_id  # noqa: E402
from orbit_tasks.platform import generator, store  # noqa: E402
from orbit_tasks.settings import load_settings  # noqa: E402
from tests.dbutil import mariadb_database, migrated_engine  # noqa: E402

REDIS_URL = os.environ.get("ORBIT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/2")


def _plan(engine: Engine, ns: bytes, kind: str, sid: bytes, batch: int) -> None:
    with engine.begin() as conn:
        rev = store.add_policy_revision(conn, ns, kind, 3600, "bench")
        plan_store.set_plan(
            conn, ns, kind, storage_id=sid, interval=86400, batch_size=batch,
            max_bytes=1024**3, policy_revision=rev, enabled=True, expect_revision=None,
            now=db_now(conn), actor="bench",
        )  # fmt: skip


def _new_job(engine: Engine, settings: Any, publish: Any, ns: bytes) -> Any:
    report = run_tick(engine, settings, publish=publish)
    job_hex = next(j for n, _, j in report.jobs_created if n == ns.hex())
    with engine.connect() as conn:
        return job_store.require_job(conn, ns, bytes.fromhex(job_hex))


def _namespace(engine: Engine, name: str, sid: bytes, batch: int, args: Any) -> bytes:
    """A namespace with the same generated history (same seed) and a due plan."""
    with engine.begin() as conn:
        ns = store.create_namespace(conn, name)
        queue = store.create_queue(conn, ns, "default")
        spec = generator.make_spec("tasks", args.roots, args.children, 30, False, 1.0)
        generator.seed_history(conn, spec, ns, [queue], random.Random(1), db_now(conn))
    _plan(engine, ns, "tasks", sid, batch)
    return ns


def _enable(engine: Engine, ns: bytes) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(archive_plans)
            .where(archive_plans.c.namespace_id == ns)
            .values(enabled=True, next_run_at=db_now(conn))
        )


def _wait(engine: Engine, job: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            j = job_store.require_job(conn, job.namespace_id, job.id)
        if j.state in (JobState.SUCCEEDED, JobState.FAILED):
            return j
        time.sleep(0.05)
    raise SystemExit(f"job {job.id.hex()} did not finish in {timeout}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roots", type=int, default=20_000)
    parser.add_argument("--children", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="orbit-bench-archive-"))
    result: dict[str, Any] = {"roots": args.roots, "children_per_root": args.children}
    with mariadb_database("orbit_bench_a") as url, migrated_engine(url, "platform") as engine:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
        env.update(
            ORBIT_DATABASE_URL=url,
            ORBIT_SENDER_DATABASE_URL=f"sqlite:///{tmp / 'business.sqlite3'}",
            CELERY_BROKER_URL=REDIS_URL,
            ORBIT_VAR_DIR=str(tmp / "var"),
            ORBIT_LOG_LEVEL="WARNING",
        )
        settings = load_settings(env)
        vol = tmp / "vol"
        sid = new_id()
        write_identity(vol, sid, "bench")
        with engine.begin() as conn:
            store.register_storage(conn, sid, "bench")
        spaces = {
            "in100": _namespace(engine, "bench-in100", sid, 100, args),
            "in10": _namespace(engine, "bench-in10", sid, 10, args),
            "w100": _namespace(engine, "bench-w100", sid, 100, args),
        }
        with engine.begin() as conn:  # only the measured plan may be due at each tick
            conn.execute(update(archive_plans).values(enabled=False))

        # in-process runner, batch 100 and batch 10
        for batch in (100, 10):
            ns = spaces[f"in{batch}"]
            _enable(engine, ns)
            job = _new_job(engine, settings, lambda *_: None, ns)
            start = time.perf_counter()
            out = None
            while out in (None, "released"):
                out = runner.run_job(
                    ns.hex(), job.id.hex(), {sid.hex(): vol}, settings, engine=engine,
                    publish=lambda *_: None,
                )  # fmt: skip
            secs = time.perf_counter() - start
            done = _wait(engine, job, 5)
            assert done.state is JobState.SUCCEEDED and done.roots == args.roots, done
            result[f"in_process_batch{batch}_roots_per_s"] = round(args.roots / secs)
            result[f"in_process_batch{batch}_bytes"] = done.bytes

        # one real worker process, batch 100
        r = redis.Redis.from_url(REDIS_URL)
        r.flushdb()
        app = Celery("bench", broker=REDIS_URL)
        log = open(tmp / "worker.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [str(ROOT / ".venv/bin/orbit"), "worker", "archive", "--volume", str(vol),
             "--no-control", "-c", "1", "-n", f"bench-{os.getpid()}@bench", "--",
             "--without-mingle", "--without-gossip", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while b"ready." not in (tmp / "worker.log").read_bytes():
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit("worker did not start; see " + str(tmp / "worker.log"))
                time.sleep(0.1)
            start = time.perf_counter()
            ns = spaces["w100"]
            _enable(engine, ns)
            job = _new_job(engine, settings, make_publisher(app), ns)
            done = _wait(engine, job, 600)
            secs = time.perf_counter() - start
            assert done.state is JobState.SUCCEEDED and done.roots == args.roots, done
            result["worker_batch100_roots_per_s"] = round(args.roots / secs)
            result["worker_batch100_files"] = done.batches + 1
            result["worker_batch100_attempts"] = done.attempts
        finally:
            os.killpg(worker.pid, 9)
            worker.wait()
            log.close()
            app.close()
            r.flushdb()
    result["ratio_batch100_vs_batch10_in_process"] = round(
        result["in_process_batch100_roots_per_s"] / result["in_process_batch10_roots_per_s"], 2
    )
    result["ratio_worker_vs_in_process_batch100"] = round(
        result["worker_batch100_roots_per_s"] / result["in_process_batch100_roots_per_s"], 2
    )
    result["measured_at_unix"] = int(time.time())
    out_path = ROOT / "bench" / "archive_throughput.json"
    out_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
