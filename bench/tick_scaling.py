"""Archive tick scaling on MariaDB: batched ticks vs the per-plan tick they replaced (NOT a test).

100k plans (4 storages, 7 kinds per namespace, inserted with multi-row inserts), then 1% and 10%
of them due; each tick is measured on the same rows in the same run, once with this tree's
``run_tick`` and once with the per-plan ``run_tick`` of ``--baseline`` (the last commit before
ticks in batches, extracted with ``git archive``). Both run in a fresh subprocess with the same
harness: one engine, statements counted with ``before_cursor_execute``, wall time and client
CPU time of ``run_tick`` only (the CPU time is the steadier number on a shared machine), wake-ups
to a no-op publisher (the sweep is bounded per tick either way). The runs of both sides are
interleaved so that they see the same load; medians are reported.
Issue 8's baseline was ~8 statements and ~3 ms per due plan (1% of 100k due: 3.1 s).
Writes bench/tick_scaling.json.

    .venv/bin/python bench/tick_scaling.py [--plans 100000] [--due 1,10] [--repeat 3]
        [--baseline-repeat 1] [--baseline REF | --baseline none]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.ids import new_id  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine  # noqa: E402
from tests.support.tick import PlanKey, reset_all, seed_plans  # noqa: E402

# The last commit whose tick handled each due plan in its own transactions.
BASELINE_REF = "d190322"
STORAGES = 4

# Runs in a subprocess whose PYTHONPATH selects the orbit_tasks tree; uses only the API both
# trees share (run_tick(engine, settings, publish), make_engine, load_settings).
MEASURE = r"""
import json, sys, time
from sqlalchemy import event
import orbit_tasks
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.db.engine import make_engine
from orbit_tasks.settings import load_settings

engine = make_engine(sys.argv[1])
with engine.connect():
    pass  # the pool's first connection is not what is measured
count = [0]

def counted(*_args):
    count[0] += 1

event.listen(engine, "before_cursor_execute", counted)

def publish(*_args, **_kw):
    pass

settings = load_settings({"ORBIT_VAR_DIR": "/tmp/orbit-bench-unused"})
cpu = time.process_time()
start = time.perf_counter()
report = run_tick(engine, settings, publish)
seconds = time.perf_counter() - start
cpu = time.process_time() - cpu
engine.dispose()
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "statements": count[0],
                  "jobs": len(report.jobs_created), "tree": orbit_tasks.__file__}))
"""


def extract_tree(ref: str, into: Path) -> Path:
    """``orbit_tasks`` of git ``ref`` under ``into`` (nothing registered in the repository)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "orbit_tasks"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(url: str, tree: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, url],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if not result["tree"].startswith(str(tree)):
        raise SystemExit(f"measured the wrong tree: {result['tree']} (wanted {tree})")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plans", type=int, default=100_000)
    parser.add_argument("--due", default="1,10", help="percentages of the plans due, e.g. 1,10")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-repeat", type=int, default=1)
    parser.add_argument("--baseline", default=BASELINE_REF, help="git ref, or 'none' to skip")
    args = parser.parse_args()
    percents = [float(p) for p in args.due.split(",")]
    result: dict[str, Any] = {"plans": args.plans, "storages": STORAGES}
    # The machine is shared: compare the ratios; the load says how far absolute times are off.
    result["load_average_1min_at_start"] = round(os.getloadavg()[0], 2)
    with (
        tempfile.TemporaryDirectory() as tmp,
        mariadb_database("orbit_bench_t") as url,
        migrated_engine(url, "platform") as engine,
    ):
        baseline = None if args.baseline == "none" else extract_tree(args.baseline, Path(tmp))
        with engine.connect() as conn:
            now = db_now(conn)
        t0 = time.perf_counter()
        keys: list[PlanKey] = []
        per_storage = args.plans // STORAGES
        for i in range(STORAGES):
            keys += seed_plans(engine, new_id(), per_storage, now=now, prefix=f"b{i}-")
        result["seed_plans_per_s"] = round(len(keys) / (time.perf_counter() - t0))
        with engine.connect() as conn:
            conn.execute(
                text("ANALYZE TABLE orbit_archive_plans, orbit_namespaces, orbit_archive_policies")
            ).all()
        for pct in percents:
            due = random.Random(int(pct * 100)).sample(keys, round(len(keys) * pct / 100))
            label = f"{pct:g}pct"
            runs: dict[str, list[dict[str, Any]]] = {"batched": [], "per_plan": []}
            # Interleaved (batched, per-plan, batched, ...): both sides see the same load.
            order = []
            for i in range(max(args.repeat, args.baseline_repeat)):
                if i < args.repeat:
                    order.append(("batched", ROOT))
                if baseline is not None and i < args.baseline_repeat:
                    order.append(("per_plan", baseline))
            for side, tree in order:
                with engine.connect() as conn:
                    at = db_now(conn) - dt.timedelta(hours=1)
                reset_all(engine, at, due)
                run = measure(url, tree)
                if run["jobs"] != len(due):
                    raise SystemExit(f"{side}: {run['jobs']} jobs for {len(due)} due plans")
                runs[side].append(run)
                print(f"{label} {side}: {run}", flush=True)
            result[f"due_{label}"] = len(due)
            for side, got in runs.items():
                if not got:
                    continue
                seconds = statistics.median(r["seconds"] for r in got)
                result[f"{side}_{label}_seconds"] = round(seconds, 3)
                cpu = statistics.median(r["cpu_seconds"] for r in got)
                result[f"{side}_{label}_client_cpu_seconds"] = round(cpu, 3)
                result[f"{side}_{label}_statements"] = got[0]["statements"]
                result[f"{side}_{label}_ms_per_due_plan"] = round(1000 * seconds / len(due), 3)
            if runs["per_plan"]:
                result[f"speedup_{label}"] = round(
                    result[f"per_plan_{label}_seconds"] / result[f"batched_{label}_seconds"], 1
                )
                result[f"statements_ratio_{label}"] = round(
                    result[f"per_plan_{label}_statements"] / result[f"batched_{label}_statements"]
                )
    result["baseline_ref"] = args.baseline
    result["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    result["measured_at_unix"] = int(time.time())
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "tick_scaling.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
