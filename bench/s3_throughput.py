"""Archive roots/s to an S3 server beside a folder, on the same rows in the same run (issue 18;
NOT a test).

One namespace of ``--events`` settled events; the same job archived twice by a fresh real
``orbit worker archive -c 1`` (Celery over Redis): once to a folder volume, once to
``s3://BUCKET/bench`` on moto's S3 server on loopback (``python -m moto.server``, the server the
tests use). moto keeps objects in memory in Python, so the ratio is a floor for a real object
store, not a prediction. The database is the shared MariaDB on 127.0.0.1:3306 (its own database,
dropped at the end). Writes bench/s3_throughput.json.

The confirm's proof that an object is stored (issue 24 item 2) costs no request when the PUT's
answer carries our SHA-256 back (AWS, moto) and one ``HeadObject`` per file when it does not:
the same job runs twice more through one pass-through proxy (tests/support/sender_proxy.py),
once as it is (``proxied_*``) and once with the checksum left out of every PUT answer
(``head_*``: a server that does not echo it), counting the requests per file.

    .venv/bin/python bench/s3_throughput.py [--events 20000]
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
from sqlalchemy import delete, text, update  # noqa: E402

from orbit_tasks.archive.jobs import JobState  # noqa: E402
from orbit_tasks.archive.store import jobs as job_store  # noqa: E402
from orbit_tasks.archive.store import plans as plan_store  # noqa: E402
from orbit_tasks.archive.tick import run_tick  # noqa: E402
from orbit_tasks.archive.wakeups import make_publisher  # noqa: E402
from orbit_tasks.db.engine import db_now, make_engine  # noqa: E402
from orbit_tasks.db.migrate import upgrade  # noqa: E402
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans  # noqa: E402
from orbit_tasks.dev import generator  # noqa: E402
from orbit_tasks.platform import store  # noqa: E402
from orbit_tasks.settings import load_settings  # noqa: E402
from tests.support.s3 import start_moto  # noqa: E402
from tests.support.sender_proxy import PASS, Fault, fault_proxy  # noqa: E402

#: a PUT answer without the checksum: the worker proves the object stored by a HEAD
NO_ECHO = Fault(drop_headers=("x-amz-checksum-sha256",))

SERVER = os.environ.get("ORBIT_BENCH_MARIADB", "mysql+mysqldb://root@127.0.0.1:3306")
REDIS_URL = os.environ.get("ORBIT_TEST_REDIS", "redis://127.0.0.1:6379") + "/4"
DB = "orbit_bench_s3"
BATCH = 100


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="orbit-bench-s3-"))
    moto = start_moto(tmp / "moto.log")
    admin = make_engine(SERVER + "/mysql", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {DB}"))
        conn.execute(text(f"CREATE DATABASE {DB} CHARACTER SET utf8mb4"))
    url = f"{SERVER}/{DB}"
    try:
        engine = make_engine(url)
        upgrade(engine, "platform")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
        env.update(
            ORBIT_DATABASE_URL=url, CELERY_BROKER_URL=REDIS_URL, ORBIT_LOG_LEVEL="WARNING",
            ORBIT_SENDER_DATABASE_URL=f"sqlite:///{tmp / 'business.sqlite3'}",
            ORBIT_VAR_DIR=str(tmp / "var"), **moto.env(),
        )  # fmt: skip
        orbit = str(ROOT / ".venv/bin/orbit")

        def init(*a: str) -> bytes:
            out = subprocess.run([orbit, "storage", "init", *a, "--json"], env=env, check=True,
                                 capture_output=True, text=True)  # fmt: skip
            return bytes.fromhex(json.loads(out.stdout)["id"])

        moto.bucket("orbit-bench")
        places = {
            "folder": (str(tmp / "vol"), init(str(tmp / "vol"))),
            "s3": ("s3://orbit-bench/bench", init(*moto.init_args("s3://orbit-bench/bench")[2:])),
        }
        with engine.begin() as conn:
            ns = store.create_namespace(conn, "bench")
            queue = store.create_queue(conn, ns, "default")
            spec = generator.make_spec("events", args.events, None, 30, False, 1.0)
            generator.seed_history(conn, spec, ns, [queue], random.Random(1), db_now(conn))
            rev = store.add_policy_revision(conn, ns, "events", 3600, "bench")
        settings = load_settings(env)
        result: dict[str, Any] = {"events": args.events, "batch_size": BATCH}
        for label, (place, sid) in places.items():
            _plan(engine, ns, sid, rev)
            for key, value in _run(
                engine, settings, env, orbit, place, sid, ns, tmp, label
            ).items():
                result[f"{label}_{key}"] = value
        for label, rule in (("proxied", PASS), ("head", NO_ECHO)):
            with fault_proxy(moto.endpoint, lambda *a, rule=rule: rule) as proxy:
                sid = init(*moto.init_args(f"s3://orbit-bench/{label}", proxy.url)[2:])
                _plan(engine, ns, sid, rev)
                place = f"s3://orbit-bench/{label}"
                for key, value in _run(engine, settings, env, orbit, place, sid, ns, tmp,
                                       label).items():  # fmt: skip
                    result[f"{label}_{key}"] = value
                files = result[f"{label}_files"]
                for method in ("PUT", "HEAD"):
                    sent = sum(1 for x in proxy.seen if x.method == method)
                    result[f"{label}_{method.lower()}s_per_file"] = round(sent / files, 3)
        result["head_over_proxied"] = round(
            result["head_roots_per_s"] / result["proxied_roots_per_s"], 2
        )
        result["s3_over_folder"] = round(result["s3_roots_per_s"] / result["folder_roots_per_s"], 2)
        result["s3_server"] = "moto (python -m moto.server, in memory) on 127.0.0.1"
        result["measured_at_unix"] = int(time.time())
        (ROOT / "bench" / "s3_throughput.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"bench: s3_throughput {result}", flush=True)
    finally:
        moto.proc.terminate()
        moto.proc.wait(timeout=10)
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {DB}"))
        admin.dispose()


def _plan(engine: Any, ns: bytes, sid: bytes, rev: int) -> None:
    """A fresh plan of the namespace's events on storage ``sid``, due now (earlier jobs gone)."""
    with engine.begin() as conn:
        conn.execute(delete(archive_jobs).where(archive_jobs.c.namespace_id == ns))
        conn.execute(delete(archive_plans).where(archive_plans.c.namespace_id == ns))
        plan_store.set_plan(
            conn, ns, "events", storage_id=sid, interval=86400, batch_size=BATCH,
            max_bytes=1024**3, policy_revision=rev, enabled=True, expect_revision=None,
            now=db_now(conn), actor="bench",
        )  # fmt: skip
        conn.execute(update(archive_plans).values(next_run_at=db_now(conn)))


def _run(engine: Any, settings: Any, env: dict[str, str], orbit: str, place: str, sid: bytes,
         ns: bytes, tmp: Path, label: str) -> dict[str, Any]:  # fmt: skip
    r = redis.Redis.from_url(REDIS_URL)
    r.flushdb()
    app = Celery("bench", broker=REDIS_URL)
    app.conf.task_create_missing_queues = True
    node = f"bench-{label}-{os.getpid()}@bench"
    log = open(tmp / f"worker-{label}.log", "wb")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [orbit, "worker", "archive", "--volume", place, "--no-control", "-c", "1", "-n", node,
         "--", "--without-mingle", "--without-gossip", "--without-heartbeat"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[node], timeout=0.5):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit(f"worker did not start; see {tmp}/worker-{label}.log")
        started = time.perf_counter()
        report = run_tick(engine, settings, publish=make_publisher(app))
        ((_, _, job_hex),) = report.jobs_created
        with engine.connect() as conn:
            while True:
                job = job_store.require_job(conn, ns, bytes.fromhex(job_hex))
                conn.rollback()
                if job.state in (JobState.SUCCEEDED, JobState.FAILED):
                    break
                time.sleep(0.05)
        seconds = time.perf_counter() - started
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()
        log.close()
        app.close()
        r.flushdb()
        r.close()
    assert job.state is JobState.SUCCEEDED, job
    out = {"roots_per_s": round(job.roots / seconds), "seconds": round(seconds, 2),
           "roots": job.roots, "files": job.batches + 1}  # fmt: skip
    print(f"bench: {label} {out}", flush=True)
    return out


if __name__ == "__main__":
    main()
