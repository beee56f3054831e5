"""Cost of the archive controls on the hot path, and the throttle's accuracy (NOT a test).

Issue 16 "Done when": the controls with **no control in force** cost at most 3% of a job's rate
against the same run without them, and a throttle holds its rate across workers.

* **hot path**: one in-process claim chain (``runner.run_job``, the code a worker runs) archives
  the same ``--roots`` events (batch 100) again and again on the shared MariaDB, alternating
  ``controls on`` (the production path: the gate read before the claim, the generation compared
  inside every chained confirm, the boundary check) and ``controls off``
  (``Settings.archive_controls=False``, the code as it was before issue 16: no gate, the
  unguarded confirm). A throttle is set on *another* storage, so the generation row exists and
  the scope's controls are looked up (the dearer case of "no control in force"). Each run's job is
  marked ABANDONED afterwards so that the next job covers the same range. Rates are medians of
  ``--rounds`` runs each; the cost is ``1 - on / off``.
* **throttle**: two real ``orbit worker archive`` processes (Celery over Redis), one job each on
  one storage throttled to ``--rate`` roots/s; the confirmed roots of both jobs over ``--window``
  seconds, as read from the database, divided by the window.

    .venv/bin/python bench/archive_controls.py [--roots 30000] [--rounds 7] [--rate 200]

Writes ``bench/archive_controls.json``. Run it alone (`flock /tmp/orbit-heavy.lock`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import update

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orbit_tasks.archive.engine import runner  # noqa: E402
from orbit_tasks.archive.jobs import JobState  # noqa: E402
from orbit_tasks.archive.store import controls as control_store  # noqa: E402
from orbit_tasks.archive.store import jobs as job_store  # noqa: E402
from orbit_tasks.db.engine import single_statements  # noqa: E402
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans  # noqa: E402
from tests.support.archive_jobs import (  # noqa: E402
    archive_env,
    create_job,
    make_due,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_for,
)
from tests.support.db import mariadb_database, migrated_engine, redis_url  # noqa: E402


def hot_path(args: Any) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="orbit-bench-ctl-") as tmp,
        mariadb_database("orbit_bench_ctl") as url,
        migrated_engine(url, "platform") as engine,
        archive_env(url, engine, Path(tmp), broker=redis_url(4)) as ae,
    ):
        ns, q = make_namespace(engine, "bench")
        vol = Path(tmp) / "vol"
        sid = make_volume(engine, vol)
        other = Path(tmp) / "other"
        other_sid = make_volume(engine, other)
        make_plan(engine, ns, "events", sid, batch_size=100, max_bytes=1024**3)
        seed(engine, ns, q, "events", args.roots)
        ae.orbit("archive", "throttle", "--storage", other_sid.hex(), "--max-roots-per-second", "5")
        settings = ae.settings.with_overrides(archive_slice_seconds=60)
        rates: dict[str, list[float]] = {"on": [], "off": []}
        cpu: dict[str, list[float]] = {"on": [], "off": []}
        order = ["on", "off"] * (args.rounds + 1)  # the first pair warms up
        total = 0
        for i, mode in enumerate(order):
            make_due(engine, ns, "events")
            job = create_job(ae, ns, "events")
            s = settings.with_overrides(archive_controls=mode == "on")
            start, cpu0 = time.perf_counter(), time.process_time()
            out = runner.run_job(
                ns.hex(), job.id.hex(), {sid.hex(): vol}, s, engine=engine,
                publish=lambda *a, **k: None,
            )  # fmt: skip
            seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
            done = ae.job(ns, job.id)
            # the roots in range: those settled before created_at - 1 h (a few more each run)
            total = done.roots
            assert out == "succeeded" and total > 0, (out, done)
            if i >= 2:
                rates[mode].append(total / seconds)
                cpu[mode].append(cpu_s * 1e6 / total)
            print(f"  {mode:>3}: {total / seconds:,.0f} roots/s", flush=True)
            with engine.begin() as conn:  # the next job covers the same range again
                conn.execute(
                    update(archive_jobs)
                    .where(archive_jobs.c.id == job.id)
                    .values(state=JobState.ABANDONED.value)
                )
                conn.execute(
                    update(archive_plans)
                    .where(archive_plans.c.namespace_id == ns)
                    .values(active_job_id=None)
                )
        on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
        # each "on" run against the "off" run right after it: drifts of a shared host cancel
        paired = statistics.median(a / b for a, b in zip(rates["on"], rates["off"], strict=True))
        guarded, plain = confirm_cost(engine, ae, ns, args)
        return {
            "hot_path_paired_cost_of_controls": round(1 - paired, 4),
            "hot_path_cpu_us_per_root_on": round(statistics.median(cpu["on"]), 2),
            "hot_path_cpu_us_per_root_off": round(statistics.median(cpu["off"]), 2),
            "confirm_guarded_us": round(guarded, 1),
            "confirm_plain_us": round(plain, 1),
            "confirm_guard_cost_per_batch_of_100_share": round(
                (guarded - plain) / (100 * 1e6 / off), 4
            ),
            "hot_path_roots": total,
            "hot_path_rounds": args.rounds,
            "hot_path_controls_on_roots_per_second": round(on),
            "hot_path_controls_off_roots_per_second": round(off),
            "hot_path_cost_of_controls": round(1 - on / off, 4),
            "hot_path_cost_target": "<= 0.03",
            "hot_path_on_runs": [round(r) for r in rates["on"]],
            "hot_path_off_runs": [round(r) for r in rates["off"]],
        }


def confirm_cost(engine: Any, ae: Any, ns: bytes, args: Any) -> tuple[float, float]:
    """The chained confirm alone, with the generation compared inside it and without, in
    alternating blocks on the runner's kind of connection: microseconds per confirm each."""
    make_due(engine, ns, "events")
    job = create_job(ae, ns, "events")
    c = job_store.claim(engine, ns, job.id, 120)
    assert c is not None
    times: dict[bool, list[float]] = {True: [], False: []}
    with engine.connect() as raw:
        conn = single_statements(raw)
        with conn.begin():
            gen = control_store.read_generation(conn)
        for block in range(2 * args.confirm_blocks):
            guarded = block % 2 == 0
            start = time.perf_counter()
            for _ in range(args.confirm_block):
                c = job_store.confirm(
                    conn, c, is_batch=True, roots=0, size=1, sha256=f"{block:064x}",
                    after="chain", lease_seconds=120, generation=gen if guarded else None,
                )  # fmt: skip
                assert c is not None
            times[guarded].append((time.perf_counter() - start) * 1e6 / args.confirm_block)
    return statistics.median(times[True]), statistics.median(times[False])


def throttle(args: Any) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="orbit-bench-thr-") as tmp,
        mariadb_database("orbit_bench_thr") as url,
        migrated_engine(url, "platform") as engine,
        archive_env(url, engine, Path(tmp), broker=redis_url(4)) as ae,
    ):
        vol = Path(tmp) / "vol"
        sid = make_volume(engine, vol)
        per_job = int(args.rate * (args.window + 30) / 2) + 1000
        for name in ("a", "b"):
            ns, q = make_namespace(engine, f"thr-{name}")
            make_plan(engine, ns, "events", sid, batch_size=10)
            seed(engine, ns, q, "events", per_job)
        ae.orbit(
            "archive", "throttle", "--storage", sid.hex(), "--max-roots-per-second",
            str(args.rate),
        )  # fmt: skip
        ae.worker("thr1", [vol])
        ae.worker("thr2", [vol])
        report = ae.tick()
        jobs = [ae.job(bytes.fromhex(n), bytes.fromhex(j)) for n, _k, j in report.jobs_created]

        def roots() -> int:
            return sum(ae.job(j.namespace_id, j.id).roots for j in jobs)

        wait_for(lambda: all(ae.job(j.namespace_id, j.id).roots for j in jobs), 60, "started")
        first, t0 = roots(), time.monotonic()
        while time.monotonic() - t0 < args.window:
            time.sleep(2)
            ae.tick()
        last, t1 = roots(), time.monotonic()
        measured = (last - first) / (t1 - t0)
        return {
            "throttle_rate": args.rate,
            "throttle_workers": 2,
            "throttle_window_seconds": round(t1 - t0, 1),
            "throttle_measured_roots_per_second": round(measured, 1),
            "throttle_measured_over_rate": round(measured / args.rate, 4),
            "throttle_target": "<= 1.10",
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roots", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--confirm-block", type=int, default=200)
    parser.add_argument("--confirm-blocks", type=int, default=10)
    parser.add_argument(
        "--no-throttle", action="store_true", help="Keep the throttle figures of the last run."
    )
    args = parser.parse_args()
    print("hot path: controls on / off, alternating", flush=True)
    result = hot_path(args)
    print(
        f"  confirm: guarded {result['confirm_guarded_us']} us, plain "
        f"{result['confirm_plain_us']} us; paired cost "
        f"{result['hot_path_paired_cost_of_controls']:.2%}",
        flush=True,
    )
    print(
        f"  cost of the controls: {result['hot_path_cost_of_controls']:.2%} "
        f"(on {result['hot_path_controls_on_roots_per_second']:,} roots/s, "
        f"off {result['hot_path_controls_off_roots_per_second']:,})",
        flush=True,
    )
    out = Path(__file__).resolve().parent / "archive_controls.json"
    if args.no_throttle and out.exists():
        last = json.loads(out.read_text())
        result |= {k: v for k, v in last.items() if k.startswith("throttle_")}
        print("throttle: kept from the last run", flush=True)
    else:
        print(f"throttle: two workers, {args.rate} roots/s, {args.window:g} s", flush=True)
        result |= throttle(args)
    print(
        f"  measured {result['throttle_measured_roots_per_second']} roots/s "
        f"({result['throttle_measured_over_rate']:.3f} of the rate)",
        flush=True,
    )
    result["measured_at_unix"] = int(time.time())
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
