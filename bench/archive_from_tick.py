"""Issue 19: the archive as an operator sees it, ``orbit archive tick`` to SUCCEEDED (NOT a test).

On a private MariaDB server (buffer pool 1 GiB, warmed: in cache), one real ``orbit worker
archive -c 1`` process already running and ready, batch 100, the same rows and order for every
contender, in one run:

* **orbit from the tick**: the clock starts when ``orbit archive tick`` is started (a fresh
  process: its start-up, the job's creation, the wake-up), and stops when the job row reads
  SUCCEEDED. Once with the read-ahead in a reader process (``ORBIT_ARCHIVE_READER=process``, the
  default on MariaDB) and once in threads of the runner's process (``thread``, the previous
  pipeline); worker CPU seconds per 100k roots (user + system of the pool process and its
  reader processes) and the pool process's peak RSS beside each.
* **pt-archiver** ``--no-delete --file --limit 100`` on the settled index, with ``--commit-each``
  and with its default (a commit per row); and the **ceiling**, the ``mariadb`` client's
  ordered scan of the same rows into /dev/null.
* **a 10k-root job phase by phase** (the job row polled every 2 ms): the tick command's run,
  tick exit -> first claim (the wake-up), the manifest, the batches, the final step.
* **start-up**: ``orbit archive tick`` (no plan due) and ``orbit job show``, median of 7 runs.

    .venv/bin/python bench/archive_from_tick.py [--events 500000] [--tasks 200000]

Writes bench/archive_from_tick.json and prints the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from sqlalchemy import delete, update  # noqa: E402

from bench.archive_throughput import BATCH, REDIS_URL, Bench, _count, _PeakRss  # noqa: E402
from orbit_tasks.archive.engine.volume import job_dir  # noqa: E402
from orbit_tasks.archive.jobs import Job, JobState  # noqa: E402
from orbit_tasks.archive.store import jobs as job_store  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans  # noqa: E402

ORBIT = str(ROOT / ".venv/bin/orbit")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its waited-for children (the reader processes)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


class FromTick(Bench):
    def make_due(self, ns: bytes) -> None:
        """Only ``ns``'s plan enabled and due; its earlier jobs and files forgotten."""
        with self.engine.begin() as conn:
            conn.execute(delete(archive_jobs).where(archive_jobs.c.namespace_id == ns))
            conn.execute(update(archive_plans).values(enabled=False, active_job_id=None))
            conn.execute(
                update(archive_plans)
                .where(archive_plans.c.namespace_id == ns)
                .values(enabled=True, next_run_at=db_now(conn))
            )
        shutil.rmtree(self.vol / ns.hex(), ignore_errors=True)

    def the_job(self, ns: bytes) -> Job | None:
        with self.engine.connect() as conn:
            jobs, _ = job_store.list_jobs(conn, ns, limit=2)
        return jobs[0] if jobs else None

    def from_tick(self, label: str, ns: bytes, reader: str, *, phases: bool = False) -> dict:
        self.make_due(ns)
        r = redis.Redis.from_url(REDIS_URL)
        r.flushdb()
        app = Celery("bench", broker=REDIS_URL)
        log_path = self.tmp / f"worker-{label}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed below
        node = f"bench-{label}-{os.getpid()}@bench"
        env = {**self.env, "ORBIT_ARCHIVE_READER": reader}
        worker = subprocess.Popen(
            [ORBIT, "worker", "archive", "--volume", str(self.vol), "--no-control", "-c", "1",
             "-n", node, "--", "--without-mingle", "--without-gossip", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not app.control.ping(destination=[node], timeout=0.5):
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit(f"worker did not start; see {log_path}")
            pool = int(
                Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()[0]
            )
            peak, cpu_before = _PeakRss(worker.pid), _cpu_seconds(pool)
            started = time.perf_counter()
            subprocess.run([ORBIT, "archive", "tick"], cwd=ROOT, env=env, check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            tick_done = time.perf_counter() - started
            marks: dict[str, float] = {"tick_command": tick_done}
            job, seen_roots = None, 0
            while True:
                job = job or self.the_job(ns)
                if job is not None:
                    with self.engine.connect() as conn:
                        j = job_store.require_job(conn, ns, job.id)
                    at = time.perf_counter() - started
                    if j.attempts and "claimed" not in marks:
                        marks["claimed"] = at
                    if j.has_manifest and "manifest" not in marks:
                        marks["manifest"] = at
                    if j.last_sha256 and j.batches and "first_batch" not in marks:
                        marks["first_batch"] = at
                    if j.roots != seen_roots:  # the last batch: the last change of roots
                        seen_roots, marks["last_batch"] = j.roots, at
                    if j.state in (JobState.SUCCEEDED, JobState.FAILED):
                        marks["succeeded"] = at
                        break
                if time.perf_counter() - started > 1800:
                    raise SystemExit(f"{label}: no SUCCEEDED; see {log_path}")
                time.sleep(0.002 if phases else 0.05)
            seconds = marks["succeeded"]
            cpu = _cpu_seconds(pool) - cpu_before
            rss = peak.stop()
        finally:
            os.killpg(worker.pid, 9)
            worker.wait()
            log.close()
            app.close()
            r.flushdb()
            r.close()
        assert j.state is JobState.SUCCEEDED, (j, log_path)
        out: dict[str, Any] = {
            "roots_per_s": round(j.roots / seconds),
            "seconds": round(seconds, 3),
            "roots": j.roots,
            "files": j.batches + 1,
            "worker_cpu_s_per_100k_roots": round(cpu / j.roots * 100_000, 2),
            "peak_rss_mib": round(rss / 1024, 1),
        }
        if phases:
            m = marks
            out["phases_s"] = {
                "tick command (start-up, job creation, wake-up)": round(m["tick_command"], 3),
                "tick exit -> first claim": round(m["claimed"] - m["tick_command"], 3),
                "claim -> manifest confirmed": round(m["manifest"] - m["claimed"], 3),
                "manifest -> last batch confirmed": round(m["last_batch"] - m["manifest"], 3),
                "last batch -> SUCCEEDED (final step)": round(m["succeeded"] - m["last_batch"], 3),
            }
        print(f"bench: {label} {out}", flush=True)
        shutil.rmtree(job_dir(self.vol, ns, j.id), ignore_errors=True)
        return out

    def start_up(self, ns: bytes) -> dict[str, float]:
        """Median wall seconds of ``orbit archive tick`` with no plan due and of ``orbit job
        show`` on a finished job."""
        self.make_due(ns)
        subprocess.run([ORBIT, "archive", "tick"], env=self.env, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        job = self.the_job(ns)
        assert job is not None
        with self.engine.begin() as conn:
            conn.execute(update(archive_plans).values(enabled=False))
        out = {}
        for name, argv in (
            ("archive_tick", [ORBIT, "archive", "tick"]),
            ("job_show", [ORBIT, "job", "show", ns.hex(), job.id.hex()]),
            ("python_import_sqlalchemy", [sys.executable, "-c", "import sqlalchemy"]),
        ):
            times = []
            for _ in range(7):
                t = time.perf_counter()
                subprocess.run(argv, env=self.env, check=True, stdout=subprocess.DEVNULL)
                times.append(time.perf_counter() - t)
            out[name] = round(statistics.median(times), 3)
            self.commands[f"start_up_{name}"] = " ".join(argv)
        print(f"bench: start-up {out}", flush=True)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--port", type=int, default=3311)
    args = parser.parse_args()
    b = FromTick(args)
    res: dict[str, Any] = {"load_average_at_start": os.getloadavg()[0]}
    try:
        b.setup()
        spaces = {
            "events": b.namespace("tick-events", "events", args.events),
            "tasks": b.namespace("tick-tasks", "tasks", args.tasks),
        }
        small = b.namespace("tick-small", "events", args.small)
        for kind, ns in spaces.items():
            job = b.new_job(ns, kind)
            until, rows = b.until(job), _count(b, kind, ns)
            b.ceiling("warm-up", kind, ns, until, rows)
            res[f"{kind}_ceiling_roots_per_s"] = round(b.ceiling("in cache", kind, ns, until, rows))
            res[f"{kind}_pt_archiver_commit_each_roots_per_s"] = round(
                b.pt_archiver(kind, ns, until, rows, each=True)
            )
            res[f"{kind}_pt_archiver_default_roots_per_s"] = round(
                b.pt_archiver(kind, ns, until, rows, each=False)
            )
            for reader in ("process", "thread"):
                for key, value in b.from_tick(f"{kind}-{reader}", ns, reader).items():
                    res[f"{kind}_orbit_{reader}_{key}"] = value
        for reader in ("process", "thread"):
            res[f"small_job_{reader}"] = b.from_tick(f"small-{reader}", small, reader, phases=True)
        res["start_up_median_s"] = b.start_up(small)
    finally:
        if hasattr(b, "engine"):
            b.engine.dispose()
        b.server.remove()
        shutil.rmtree(b.tmp, ignore_errors=True)
    for kind in ("events", "tasks"):
        for reader in ("process", "thread"):
            rate = res[f"{kind}_orbit_{reader}_roots_per_s"]
            res[f"{kind}_{reader}_over_pt_archiver_commit_each"] = round(
                rate / res[f"{kind}_pt_archiver_commit_each_roots_per_s"], 2
            )
            res[f"{kind}_{reader}_over_pt_archiver_default"] = round(
                rate / res[f"{kind}_pt_archiver_default_roots_per_s"], 2
            )
            res[f"{kind}_{reader}_share_of_ceiling"] = round(
                rate / res[f"{kind}_ceiling_roots_per_s"], 3
            )
    res["load_average_at_end"] = os.getloadavg()[0]
    res["sizes"] = (
        f"events {args.events}, tasks {args.tasks} (+2 attempts each), small {args.small} events,"
        f" batch {BATCH}"
    )
    for key, cmd in sorted(b.commands.items()):
        res[f"command_{key}"] = cmd
        print(f"bench: {key}: {cmd}")
    res["measured_at_unix"] = int(time.time())
    path = ROOT / "bench" / "archive_from_tick.json"
    path.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(json.dumps(res, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
