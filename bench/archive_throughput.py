"""Archive throughput of one worker beside pt-archiver and the ceiling, in one run (NOT a test).

Issue 8's table, measured here on a private MariaDB server the benchmark starts itself (port
``--port``, datadir under /tmp; stopped and removed at the end):

* **in cache**: buffer pool 1 GiB, warmed by one scan first. For ``events`` and ``tasks`` (two
  attempts per task): the *ceiling* (the ``mariadb`` client scanning the job's rows in settled
  order into /dev/null), *pt-archiver* (``--no-delete --file --limit 100`` on the settled
  index, the same rows; once with ``--commit-each`` -- one transaction per chunk, which the
  targets are judged against -- and once with its default of a commit per row) and *orbit* (a
  real ``orbit worker archive -c 1`` process: Celery over Redis, default lease and time slice,
  continuation wake-ups included) archiving one job from its wake-up to SUCCEEDED, batch 100,
  with the job's per-fifth rates.
* **out of cache**: the same server restarted with a 128 MB buffer pool (O_DIRECT), cold
  before each measurement: the ceiling and orbit.
* **worker peak RSS** (VmHWM of the pool process) for a 10k-root and a 150k-root events job,
  each in a fresh worker.

Sizes (default, issue 8 used 500k roots): 200,000 events and 100,000 tasks; they keep one run
within a few minutes on the shared 2-core machine. Writes bench/archive_throughput.json and
prints the exact pt-archiver and ceiling commands.

    .venv/bin/python bench/archive_throughput.py [--events 200000] [--tasks 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from sqlalchemy import Engine, delete, text, update  # noqa: E402

from bench.mariadb_instance import MariaDBInstance  # noqa: E402
from orbit_tasks.archive.engine.volume import job_dir, write_identity  # noqa: E402
from orbit_tasks.archive.jobs import Job, JobState  # noqa: E402
from orbit_tasks.archive.store import jobs as job_store  # noqa: E402
from orbit_tasks.archive.store import plans as plan_store  # noqa: E402
from orbit_tasks.archive.tick import run_tick  # noqa: E402
from orbit_tasks.archive.wakeups import make_publisher  # noqa: E402
from orbit_tasks.db.engine import db_now, make_engine  # noqa: E402
from orbit_tasks.db.migrate import upgrade  # noqa: E402
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans  # noqa: E402
from orbit_tasks.dev import generator  # noqa: E402
from orbit_tasks.ids import new_id  # noqa: E402
from orbit_tasks.platform import store  # noqa: E402
from orbit_tasks.platform.history import HISTORY_KINDS  # noqa: E402
from orbit_tasks.settings import load_settings  # noqa: E402

_REDIS = os.environ.get("ORBIT_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")
REDIS_URL = os.environ.get("ORBIT_BENCH_REDIS_URL", f"{_REDIS}/3")
DB = "orbit_bench"
BATCH = 100


class Bench:
    def __init__(self, args: Any) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="orbit-bench-archive-"))
        self.server = MariaDBInstance(args.port)
        self.result: dict[str, Any] = {}
        self.commands: dict[str, str] = {}
        self.vol = self.tmp / "vol"
        self.sid = new_id()
        self.engine: Engine
        self.url = ""
        self.env: dict[str, str] = {}

    # --- setup ----------------------------------------------------------------------------

    def setup(self) -> None:
        self.server.start("1G")
        admin = make_engine(self.server.server_url + "/mysql", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {DB} CHARACTER SET utf8mb4"))
        admin.dispose()
        self.url = f"{self.server.server_url}/{DB}"
        self.engine = make_engine(self.url)
        upgrade(self.engine, "platform")
        write_identity(self.vol, self.sid, "bench")
        with self.engine.begin() as conn:
            store.register_storage(conn, self.sid, "bench")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
        self.env.update(
            ORBIT_DATABASE_URL=self.url,
            ORBIT_SENDER_DATABASE_URL=f"sqlite:///{self.tmp / 'business.sqlite3'}",
            CELERY_BROKER_URL=REDIS_URL,
            ORBIT_VAR_DIR=str(self.tmp / "var"),
            ORBIT_LOG_LEVEL="WARNING",
        )
        self.settings = load_settings(self.env)

    def namespace(self, name: str, kind: str, roots: int) -> bytes:
        started = time.monotonic()
        with self.engine.begin() as conn:
            ns = store.create_namespace(conn, name)
            queue = store.create_queue(conn, ns, "default")
            spec = generator.make_spec(kind, roots, 2 if kind == "tasks" else None, 30, False, 1.0)
            generator.seed_history(conn, spec, ns, [queue], random.Random(1), db_now(conn))
            rev = store.add_policy_revision(conn, ns, kind, 3600, "bench")
            plan_store.set_plan(
                conn, ns, kind, storage_id=self.sid, interval=86400, batch_size=BATCH,
                max_bytes=1024**3, policy_revision=rev, enabled=False, expect_revision=None,
                now=db_now(conn), actor="bench",
            )  # fmt: skip
        print(f"bench: seeded {roots} {kind} in {time.monotonic() - started:.0f}s", flush=True)
        return ns

    def new_job(self, ns: bytes, kind: str) -> Job:
        """A fresh job over the namespace's settled roots (earlier jobs are forgotten: every
        measurement archives the same rows)."""
        with self.engine.begin() as conn:
            conn.execute(delete(archive_jobs).where(archive_jobs.c.namespace_id == ns))
            conn.execute(
                update(archive_plans)
                .where(archive_plans.c.namespace_id == ns)
                .values(enabled=True, active_job_id=None, next_run_at=db_now(conn))
            )
        shutil.rmtree(self.vol / ns.hex(), ignore_errors=True)
        report = run_tick(self.engine, self.settings, publish=lambda *a, **k: None)
        with self.engine.begin() as conn:
            conn.execute(update(archive_plans).values(enabled=False))
            (job_hex,) = [j for n, k, j in report.jobs_created if n == ns.hex() and k == kind]
            return job_store.require_job(conn, ns, bytes.fromhex(job_hex))

    def until(self, job: Job) -> str:
        with self.engine.connect() as conn:
            rng = job_store.job_range(conn, job)
        return rng.until.strftime("%Y-%m-%d %H:%M:%S.%f")

    # --- the three measurements -----------------------------------------------------------

    def ceiling(self, label: str, kind: str, ns: bytes, until: str, rows: int) -> float:
        hk = HISTORY_KINDS[kind]
        where = f"r.namespace_id = UNHEX('{ns.hex()}') AND r.{hk.settled_column} < '{until}'"
        index = f"ix_{'task' if kind == 'tasks' else 'event'}_settled"
        if hk.children:
            (child,) = hk.children
            sql = (
                f"SELECT r.*, c.* FROM {hk.root.name} r FORCE INDEX ({index}) "
                f"LEFT JOIN {child.table.name} c ON c.namespace_id = r.namespace_id "
                f"AND c.{child.parent_column} = r.id WHERE {where} "
                f"ORDER BY r.{hk.settled_column}, r.id, c.attempt_no"
            )
        else:
            sql = f"SELECT r.* FROM {hk.root.name} r FORCE INDEX ({index}) WHERE {where} "
            sql += f"ORDER BY r.{hk.settled_column}, r.id"
        cmd = [*self.server.client(DB), "--quick", "-N", "-e", sql]
        self.commands[f"ceiling_{kind}"] = " ".join(cmd[:-1]) + f' "{sql}" > /dev/null'
        started = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rate = rows / (time.perf_counter() - started)
        print(f"bench: {label} ceiling {rate:,.0f} roots/s", flush=True)
        return rate

    def pt_archiver(self, kind: str, ns: bytes, until: str, rows: int, *, each: bool) -> float:
        """pt-archiver copying the same roots. ``each``: ``--commit-each`` (one transaction per
        chunk of ``--limit`` rows, as orbit commits one batch file at a time); without it the
        issue's literal command, whose default ``--txn-size 1`` commits after every row."""
        hk = HISTORY_KINDS[kind]
        index = f"ix_{'task' if kind == 'tasks' else 'event'}_settled"
        out = self.tmp / f"pt-{kind}.txt"
        where = f"namespace_id = UNHEX('{ns.hex()}') AND {hk.settled_column} < '{until}'"
        cmd = [
            "pt-archiver", "--source",
            f"h=127.0.0.1,P={self.server.port},u=root,D={DB},t={hk.root.name},i={index},A=utf8mb4",
            "--where", where, "--no-delete", "--file", str(out), "--limit", str(BATCH),
            *(["--commit-each"] if each else []),
        ]  # fmt: skip
        label = f"pt_archiver_{kind}" + ("_commit_each" if each else "")
        self.commands[label] = " ".join(f'"{a}"' if " " in a else a for a in cmd)
        started = time.perf_counter()
        subprocess.run(cmd, check=True)
        rate = rows / (time.perf_counter() - started)
        out.unlink(missing_ok=True)
        print(f"bench: {label.replace('_', ' ')} {rate:,.0f} rows/s", flush=True)
        return rate

    def orbit(self, label: str, ns: bytes, kind: str) -> dict[str, Any]:
        """One job archived by a fresh real worker; rate, per-fifth rates, peak RSS."""
        job = self.new_job(ns, kind)
        r = redis.Redis.from_url(REDIS_URL)
        r.flushdb()
        app = Celery("bench", broker=REDIS_URL)
        app.conf.task_create_missing_queues = True
        log_path = self.tmp / f"worker-{label}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed below
        node = f"bench-{label}-{os.getpid()}@bench"
        worker = subprocess.Popen(
            [str(ROOT / ".venv/bin/orbit"), "worker", "archive", "--volume", str(self.vol),
             "--no-control", "-c", "1", "-n", node, "--",
             "--without-mingle", "--without-gossip", "--without-heartbeat"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            # Ready = answers a remote-control ping (its log runs at WARNING: no "ready." line).
            deadline = time.monotonic() + 60
            while not app.control.ping(destination=[node], timeout=0.5):
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit(f"worker did not start; see {log_path}")
            peak = _PeakRss(worker.pid)
            started = time.perf_counter()
            make_publisher(app)(self.sid, ns, job.id, kind=kind)
            progress = self._follow(job, started)
            seconds = time.perf_counter() - started
            rss = peak.stop()
        finally:
            os.killpg(worker.pid, 9)
            worker.wait()
            log.close()
            app.close()
            r.flushdb()
            r.close()
        done = progress[-1][2]
        assert done.state is JobState.SUCCEEDED, (done, log_path)
        fifths = _fifths(progress, done.roots)
        out = {
            "roots_per_s": round(done.roots / seconds),
            "seconds": round(seconds, 2),
            "roots": done.roots,
            "files": done.batches + 1,
            "attempts": done.attempts,
            "fifth_roots_per_s": fifths,
            "last_fifth_over_first": round(fifths[-1] / fifths[0], 2),
            "peak_rss_mib": round(rss / 1024, 1),
        }
        print(f"bench: {label} orbit {out}", flush=True)
        shutil.rmtree(job_dir(self.vol, ns, job.id), ignore_errors=True)
        return out

    def _follow(self, job: Job, started: float) -> list[tuple[float, int, Job]]:
        points: list[tuple[float, int, Job]] = []
        with self.engine.connect() as conn:
            while True:
                j = job_store.require_job(conn, job.namespace_id, job.id)
                conn.rollback()
                points.append((time.perf_counter() - started, j.roots, j))
                if j.state in (JobState.SUCCEEDED, JobState.FAILED):
                    return points
                if points[-1][0] > 1800:
                    raise SystemExit(f"job {job.id.hex()} did not finish")
                time.sleep(0.1)


class _PeakRss:
    """VmHWM of the worker's pool process(es), read until stopped (kB)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            return
        for pid in children:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak = max(self.peak, int(line.split()[1]))
            except OSError:
                continue

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            self._read()

    def stop(self) -> int:
        self._read()
        self._done.set()
        self._thread.join()
        return self.peak


def _fifths(points: list[tuple[float, int, Any]], total: int) -> list[int]:
    """Roots/s within each fifth of the job's roots (times interpolated from the polls)."""

    def at(roots: float) -> float:
        prev = (0.0, 0)
        for t, n, _ in points:
            if n >= roots:
                if n == prev[1]:
                    return t
                return prev[0] + (t - prev[0]) * (roots - prev[1]) / (n - prev[1])
            prev = (t, n)
        return points[-1][0]

    marks = [at(total * k / 5) for k in range(6)]
    return [round(total / 5 / max(marks[k + 1] - marks[k], 1e-6)) for k in range(5)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rss-small", type=int, default=10_000)
    parser.add_argument("--rss-large", type=int, default=150_000)
    parser.add_argument("--port", type=int, default=3310)
    args = parser.parse_args()
    b = Bench(args)
    res = b.result
    res["load_average_at_start"] = os.getloadavg()[0]
    try:
        b.setup()
        spaces = {
            "events": b.namespace("bench-events", "events", args.events),
            "tasks": b.namespace("bench-tasks", "tasks", args.tasks),
        }
        small = b.namespace("bench-rss-small", "events", args.rss_small)
        large = b.namespace("bench-rss-large", "events", args.rss_large)
        for kind, ns in spaces.items():  # in cache: 1 GiB pool, warmed
            job = b.new_job(ns, kind)
            until, rows = b.until(job), _count(b, kind, ns)
            b.ceiling("warm-up", kind, ns, until, rows)
            res[f"{kind}_in_cache_ceiling_roots_per_s"] = round(
                b.ceiling("in cache", kind, ns, until, rows)
            )
            res[f"{kind}_in_cache_pt_archiver_txn1_roots_per_s"] = round(
                b.pt_archiver(kind, ns, until, rows, each=False)
            )
            res[f"{kind}_in_cache_pt_archiver_roots_per_s"] = round(
                b.pt_archiver(kind, ns, until, rows, each=True)
            )
            orbit = b.orbit(f"{kind}-in-cache", ns, kind)
            for key, value in orbit.items():
                res[f"{kind}_in_cache_orbit_{key}"] = value
        for kind, ns in spaces.items():  # out of cache: 128 MB pool, cold each time
            job = b.new_job(ns, kind)
            until, rows = b.until(job), _count(b, kind, ns)
            b.engine.dispose()
            b.server.restart("128M")
            res[f"{kind}_out_of_cache_ceiling_roots_per_s"] = round(
                b.ceiling("out of cache", kind, ns, until, rows)
            )
            b.engine.dispose()
            b.server.restart("128M")
            orbit = b.orbit(f"{kind}-out-of-cache", ns, kind)
            res[f"{kind}_out_of_cache_orbit_roots_per_s"] = orbit["roots_per_s"]
            res[f"{kind}_out_of_cache_orbit_fifth_roots_per_s"] = orbit["fifth_roots_per_s"]
        b.engine.dispose()
        b.server.restart("1G")
        for label, ns in (("small", small), ("large", large)):
            orbit = b.orbit(f"rss-{label}", ns, "events")
            res[f"rss_{label}_job_roots"] = orbit["roots"]
            res[f"rss_{label}_job_peak_mib"] = orbit["peak_rss_mib"]
    finally:
        if hasattr(b, "engine"):
            b.engine.dispose()
        b.server.remove()
        shutil.rmtree(b.tmp, ignore_errors=True)
    _ratios(res)
    res["load_average_at_end"] = os.getloadavg()[0]
    res["sizes"] = f"events {args.events}, tasks {args.tasks} (+2 attempts each), batch {BATCH}"
    for key, cmd in sorted(b.commands.items()):
        res[f"command_{key}"] = cmd
        print(f"bench: {key}: {cmd}")
    res["measured_at_unix"] = int(time.time())
    path = ROOT / "bench" / "archive_throughput.json"
    path.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(json.dumps(res, indent=2, sort_keys=True))


def _count(b: Bench, kind: str, ns: bytes) -> int:
    with b.engine.connect() as conn:
        return int(
            conn.execute(
                text(f"SELECT COUNT(*) FROM {HISTORY_KINDS[kind].root.name} WHERE namespace_id=:n"),
                {"n": ns},
            ).scalar_one()
        )


def _ratios(res: dict[str, Any]) -> None:
    """The targets of issue 8 as ratios measured in this run. pt-archiver is judged in its
    faster configuration (``--commit-each``); the ratio to its default (a commit per row, the
    issue's literal command) is reported beside it."""
    ev, ta = "events_in_cache", "tasks_in_cache"
    for k in (ev, ta):
        res[f"{k}_orbit_over_pt_archiver_txn1"] = round(
            res[f"{k}_orbit_roots_per_s"] / res[f"{k}_pt_archiver_txn1_roots_per_s"], 2
        )
    res["events_in_cache_orbit_over_pt_archiver"] = round(
        res[f"{ev}_orbit_roots_per_s"] / res[f"{ev}_pt_archiver_roots_per_s"], 2
    )  # target >= 0.4
    res["events_in_cache_orbit_share_of_ceiling"] = round(
        res[f"{ev}_orbit_roots_per_s"] / res[f"{ev}_ceiling_roots_per_s"], 3
    )  # target >= 0.08
    res["events_out_of_cache_orbit_share_of_ceiling"] = round(
        res["events_out_of_cache_orbit_roots_per_s"]
        / res["events_out_of_cache_ceiling_roots_per_s"],
        3,
    )  # target >= 0.6
    res["tasks_out_of_cache_orbit_share_of_ceiling"] = round(
        res["tasks_out_of_cache_orbit_roots_per_s"] / res["tasks_out_of_cache_ceiling_roots_per_s"],
        3,
    )
    res["tasks_in_cache_orbit_over_pt_archiver"] = round(
        res[f"{ta}_orbit_roots_per_s"] / res[f"{ta}_pt_archiver_roots_per_s"], 2
    )  # target >= 3
    res["rss_large_minus_small_mib"] = round(
        res["rss_large_job_peak_mib"] - res["rss_small_job_peak_mib"], 1
    )  # target <= 12
    res["targets"] = ", ".join(
        f"{name} {'met' if ok else 'MISSED'}"
        for name, ok in (
            ("events>=0.4x pt-archiver", res["events_in_cache_orbit_over_pt_archiver"] >= 0.4),
            ("events>=8% ceiling", res["events_in_cache_orbit_share_of_ceiling"] >= 0.08),
            ("out-of-cache>=60% ceiling", res["events_out_of_cache_orbit_share_of_ceiling"] >= 0.6),
            ("tasks>=3x pt-archiver", res["tasks_in_cache_orbit_over_pt_archiver"] >= 3),
            (
                "last fifth>=80% first",
                min(res[f"{k}_in_cache_orbit_last_fifth_over_first"] for k in ("events", "tasks"))
                >= 0.8,
            ),
            ("rss +<=12MiB", res["rss_large_minus_small_mib"] <= 12),
        )
    )


if __name__ == "__main__":
    main()
