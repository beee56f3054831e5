"""Issue 25: a backlog caught up in budget-sized jobs, from the operator's side (NOT a test).

On a private MariaDB server (buffer pool 1 GiB, warmed: in cache), one real ``orbit worker
archive -c 1`` process already running and ready (the reader process, the default on MariaDB),
batch 100, the same settled event roots for every contender, in one run:

* **catch-up**: the plan's budget is small (``--budget``, default 4 MiB: the issue's job size,
  ~40k event roots), so the backlog is archived as consecutive jobs, each cut to its budget by its
  first claim and created by the success of the one before (SPEC §5). The clock starts when
  ``orbit plan run NS events`` is started (the plan due now, the tick woken on ``orbit.control``,
  which the one worker consumes too, as a one-worker deployment does) and stops when the plan has
  no active job and every job is SUCCEEDED. Jobs, roots per second, worker CPU, peak RSS, and each
  job's phases (the job rows polled every 5 ms): creation -> first claim (the wake-up), claim ->
  manifest confirmed (the cut: the sample, the index walk, the count, the record, the manifest),
  manifest -> last batch, last batch -> SUCCEEDED (the final verify, finalize and the next job's
  creation).
* **one job**: the same rows with a budget that fits them (1 GiB), from the same command.
* **pt-archiver** ``--no-delete --file --limit 100 --commit-each`` over the same rows.

    .venv/bin/python bench/archive_catchup.py [--events 500000] [--budget 4MiB] [--profile DIR]

``--profile DIR``: py-spy (``pip install py-spy`` into the venv) samples the worker's pool
process and its reader process for each contender (``DIR/<label>.txt``, collapsed stacks, idle
frames included: where the wall time goes); the rates are then not the benchmark's.

Writes bench/archive_catchup.json and prints the commands.

``--large`` (the issue's 10M-root backlog, or the largest that fits): the catch-up alone (no
warm-up, no pt-archiver, no one-job run), the job rows polled every 0.2 s, and the RSS of the
worker's processes sampled every ``--rss-every`` seconds into a series (to show it flat across
the run), with the load averages; writes bench/archive_catchup_large.json instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from sqlalchemy import delete, select, update  # noqa: E402

from bench.archive_from_tick import ORBIT, FromTick, _cpu_seconds  # noqa: E402
from bench.archive_throughput import BATCH, REDIS_URL, _count, _PeakRss  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.db.platform_tables import archive_job_ends, archive_jobs, archive_plans  # noqa: E402
from orbit_tasks.units import parse_size  # noqa: E402

J = archive_jobs.c


class CatchUp(FromTick):
    def start(self, ns: bytes, max_bytes: int) -> None:
        """Only ``ns``'s plan enabled (not due: ``orbit plan run`` makes it due) with
        ``max_bytes``; earlier jobs forgotten."""
        with self.engine.begin() as conn:
            conn.execute(delete(archive_jobs).where(J.namespace_id == ns))
            conn.execute(delete(archive_job_ends).where(archive_job_ends.c.namespace_id == ns))
            conn.execute(update(archive_plans).values(enabled=False, active_job_id=None))
            conn.execute(
                update(archive_plans)
                .where(archive_plans.c.namespace_id == ns)
                .values(
                    enabled=True,
                    next_run_at=db_now(conn) + timedelta(days=1),
                    max_bytes=max_bytes,
                )
            )
        shutil.rmtree(self.vol / ns.hex(), ignore_errors=True)

    def _rows(self, ns: bytes) -> tuple[list[Any], Any]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(J.id, J.state, J.attempts, J.batches, J.roots, J.bytes, J.last_sha256)
                .where(J.namespace_id == ns)
                .order_by(J.created_at, J.id)
            ).all()
            active = conn.execute(
                select(archive_plans.c.active_job_id).where(archive_plans.c.namespace_id == ns)
            ).scalar()
        return list(rows), active

    def _updates(self) -> int:
        """The server's count of UPDATE statements so far (``Com_update``): a group's confirm is
        one, so files per UPDATE is a lower bound of the mean group size (claims, releases and
        each job's finalize are UPDATEs too)."""
        with self.engine.connect() as conn:
            row = conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Com_update'").one()
        return int(row[1])

    def _profile(self, label: str, pool: int) -> subprocess.Popen[bytes] | None:
        if self.args.profile is None:
            return None
        out = Path(self.args.profile) / f"{label}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        spy = ROOT / ".venv/bin/py-spy"
        return subprocess.Popen(
            [str(spy), "record", "--pid", str(pool), "--subprocesses", "--idle", "--threads",
             "--rate", "250", "--format", "raw", "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def run(
        self,
        label: str,
        ns: bytes,
        max_bytes: int,
        *,
        poll: float = 0.005,
        rss_every: float = 0.0,
        timeout: float = 1800,
    ) -> dict[str, Any]:
        self.start(ns, max_bytes)
        series: list[dict[str, Any]] = []
        r = redis.Redis.from_url(REDIS_URL)
        r.flushdb()
        app = Celery("bench", broker=REDIS_URL)
        log_path = self.tmp / f"worker-{label}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed below
        node = f"bench-{label}-{os.getpid()}@bench"
        worker = subprocess.Popen(
            [ORBIT, "worker", "archive", "--volume", str(self.vol), "-c", "1",
             "-n", node, "--", "--without-mingle", "--without-gossip", "--without-heartbeat"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        seen: dict[bytes, dict[str, float]] = {}
        try:
            deadline = time.monotonic() + 60
            while not app.control.ping(destination=[node], timeout=0.5):
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit(f"worker did not start; see {log_path}")
            pool = int(
                Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()[0]
            )
            peak, cpu_before = _PeakRss(worker.pid), _cpu_seconds(pool)
            updates_before = self._updates()
            spy = self._profile(label, pool)
            started = time.perf_counter()
            subprocess.run([ORBIT, "plan", "run", ns.hex(), "events"], cwd=ROOT, env=self.env,
                           check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            sample_at = 0.0
            while True:
                rows, active = self._rows(ns)
                at = time.perf_counter() - started
                if rss_every and at >= sample_at:
                    series.append(_rss_sample(worker.pid, at, sum(row.roots for row in rows)))
                    sample_at = at + rss_every
                for row in rows:
                    m = seen.setdefault(bytes(row.id), {"created": at})
                    if row.attempts and "claimed" not in m:
                        m["claimed"] = at
                    if row.last_sha256 and "manifest" not in m:
                        m["manifest"] = at
                    if row.roots != m.get("roots", -1):
                        m["roots"], m["last_batch"] = row.roots, at
                    if row.state in ("SUCCEEDED", "FAILED") and "done" not in m:
                        m["done"] = at
                if any(row.state == "FAILED" for row in rows):
                    raise SystemExit(f"{label}: a job FAILED; see {log_path}")
                if rows and active is None and all(row.state == "SUCCEEDED" for row in rows):
                    break
                if at > timeout:
                    raise SystemExit(f"{label}: not caught up; see {log_path}")
                time.sleep(poll)
            seconds = time.perf_counter() - started
            if rss_every:
                series.append(_rss_sample(worker.pid, seconds, sum(row.roots for row in rows)))
            cpu = _cpu_seconds(pool) - cpu_before
            updates = self._updates() - updates_before
            rss = peak.stop()
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
        finally:
            os.killpg(worker.pid, 9)
            worker.wait()
            log.close()
            app.close()
            r.flushdb()
            r.close()
        roots = sum(row.roots for row in rows)
        out: dict[str, Any] = {
            "roots_per_s": round(roots / seconds),
            "seconds": round(seconds, 3),
            "jobs": len(rows),
            "roots": roots,
            "bytes_max_of_jobs": max(row.bytes for row in rows),
            "files": sum(row.batches + 1 for row in rows),
            "worker_cpu_s_per_100k_roots": round(cpu / roots * 100_000, 2),
            "peak_rss_mib": round(rss / 1024, 1),
            "update_statements": updates,
            "files_per_update_statement": round(sum(r.batches + 1 for r in rows) / updates, 2),
        }
        phases = [m for m in seen.values() if {"claimed", "manifest", "done"} <= set(m)]
        if len(phases) > 1 and poll < 0.05:  # (--large polls too seldom for phases)
            med = statistics.median
            out["per_job_phases_median_s"] = {
                "creation -> first claim (wake-up)": round(
                    med(m["claimed"] - m["created"] for m in phases[1:]), 4
                ),
                "claim -> manifest confirmed (cut, count, record, manifest)": round(
                    med(m["manifest"] - m["claimed"] for m in phases), 4
                ),
                "manifest -> last batch confirmed": round(
                    med(m["last_batch"] - m["manifest"] for m in phases), 4
                ),
                "last batch -> SUCCEEDED (verify, finalize, next job)": round(
                    med(m["done"] - m["last_batch"] for m in phases), 4
                ),
            }
        if series:
            out["rss_series"] = series
        print(f"bench: {label} {out}", flush=True)
        shutil.rmtree(self.vol / ns.hex(), ignore_errors=True)
        return out


def _rss_sample(main_pid: int, at: float, roots: int) -> dict[str, Any]:
    """VmRSS (MiB) of the worker's main process, of its pool process(es) and of the pool's own
    children (the reader process), at ``at`` seconds with ``roots`` archived so far."""

    def rss(pid: str) -> float:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def children(pid: str) -> list[str]:
        try:
            return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return []

    pools = children(str(main_pid))
    return {
        "t_s": round(at, 1),
        "roots": roots,
        "main_rss_mib": round(rss(str(main_pid)), 1),
        "pool_rss_mib": round(sum(rss(p) for p in pools), 1),
        "readers_rss_mib": round(sum(rss(c) for p in pools for c in children(p)), 1),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def large(args: argparse.Namespace, budget: int) -> None:
    """``--large``: the catch-up of ``--events`` roots alone, RSS sampled across it."""
    b = CatchUp(args)
    res: dict[str, Any] = {"load_averages_at_start": os.getloadavg()}
    try:
        b.setup()
        started = time.monotonic()
        ns = b.namespace("catchup-large", "events", args.events)
        res["seed_seconds"] = round(time.monotonic() - started)
        res["load_averages_after_seed"] = os.getloadavg()
        res["catch_up"] = b.run(
            "catch-up-large", ns, budget, poll=0.2, rss_every=args.rss_every, timeout=4 * 3600
        )
    finally:
        if hasattr(b, "engine"):
            b.engine.dispose()
        b.server.remove()
        shutil.rmtree(b.tmp, ignore_errors=True)
    series = res["catch_up"]["rss_series"]
    pool = [s["pool_rss_mib"] for s in series if s["pool_rss_mib"]]
    res["pool_rss_mib_start_middle_end_peak"] = [
        pool[0], pool[len(pool) // 2], pool[-1], max(pool)
    ]  # fmt: skip
    res["load_averages_at_end"] = os.getloadavg()
    res["sizes"] = (
        f"events {args.events}, budget {args.budget} per job, batch {BATCH}, catch-up only"
    )
    res["measured_at_unix"] = int(time.time())
    path = ROOT / "bench" / "archive_catchup_large.json"
    path.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "catch_up"}, indent=2, sort_keys=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--budget", default="4MiB")
    parser.add_argument("--port", type=int, default=3313)
    parser.add_argument("--large", action="store_true", help="the catch-up alone, RSS sampled")
    parser.add_argument("--rss-every", type=float, default=5.0, help="seconds (with --large)")
    parser.add_argument("--profile", default=None, help="a directory for py-spy's stacks")
    parser.add_argument(
        "--only",
        choices=("catch-up", "one-job"),
        default=None,
        help="one contender and no pt-archiver (a profile); writes no JSON",
    )
    args = parser.parse_args()
    args.tasks = args.small = 0
    budget = parse_size(args.budget)
    if args.large:
        large(args, budget)
        return
    b = CatchUp(args)
    res: dict[str, Any] = {"load_average_at_start": os.getloadavg()[0]}
    try:
        b.setup()
        ns = b.namespace("catchup-events", "events", args.events)
        job = b.new_job(ns, "events")
        until, rows = b.until(job), _count(b, "events", ns)
        b.ceiling("warm-up", "events", ns, until, rows)
        if args.only is not None:
            b.run(args.only, ns, budget if args.only == "catch-up" else 1024**3)
            return
        res["pt_archiver_commit_each_roots_per_s"] = round(
            b.pt_archiver("events", ns, until, rows, each=True)
        )
        res["catch_up"] = b.run("catch-up", ns, budget)
        res["one_job"] = b.run("one-job", ns, 1024**3)
    finally:
        if hasattr(b, "engine"):
            b.engine.dispose()
        b.server.remove()
        shutil.rmtree(b.tmp, ignore_errors=True)
    rate = res["catch_up"]["roots_per_s"]
    res["catch_up_over_pt_archiver_commit_each"] = round(
        rate / res["pt_archiver_commit_each_roots_per_s"], 2
    )
    res["catch_up_over_one_job"] = round(rate / res["one_job"]["roots_per_s"], 2)
    res["load_average_at_end"] = os.getloadavg()[0]
    res["sizes"] = f"events {args.events}, budget {args.budget} per job, batch {BATCH}"
    for key, cmd in sorted(b.commands.items()):
        res[f"command_{key}"] = cmd
        print(f"bench: {key}: {cmd}")
    res["measured_at_unix"] = int(time.time())
    path = ROOT / "bench" / "archive_catchup.json"
    path.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(json.dumps(res, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
