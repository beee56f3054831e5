"""``make bench``: run every benchmark script in one go and collect bench/RESULTS.md.

Benchmarks are separate from the tests: they print ratios measured in one run on this machine
and each writes ``bench/<name>.json``; this runner turns those into one page, with issue 8's
targets first. ``bench/run.py NAME ...`` reruns only those scripts and rebuilds the page from
every result file (each section says when it was measured); ``bench/run.py --render`` runs
nothing and only rebuilds the page from the result files committed (``make bench-results``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
SCRIPTS = [
    "keyset",
    "archive_throughput",
    "sender_throughput",
    "sender_prune",
    "sender_latency",
    "restore_throughput",
    "metrics_scrape",
    "tick_scaling",
    "s3_throughput",
    "archive_controls",
    "archive_from_tick",
    "replica_check",
    "archive_catchup",
    "archive_find",
    "archive_scrub",
    "console_pages",
]


def _load(name: str) -> dict[str, Any] | None:
    path = BENCH / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _when(doc: dict[str, Any]) -> str:
    at = doc.get("measured_at_unix")
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at)) if at else "unknown"


def _targets(docs: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 8's targets, each as measured (ratios within one run of its benchmark)."""
    rows: list[tuple[str, str, str, bool]] = []
    a = docs.get("archive_throughput")
    if a:
        ev, ta = "events_in_cache", "tasks_in_cache"
        last = min(a[f"{k}_orbit_last_fifth_over_first"] for k in (ev, ta))
        rows += [
            ("events in cache vs pt-archiver (--commit-each)", ">= 0.4x",
             f"{a[f'{ev}_orbit_over_pt_archiver']}x "
             f"(vs its default commit per row: {a.get(f'{ev}_orbit_over_pt_archiver_txn1')}x)",
             a[f"{ev}_orbit_over_pt_archiver"] >= 0.4),
            ("events in cache, share of the ceiling scan", ">= 8%",
             f"{a[f'{ev}_orbit_share_of_ceiling']:.1%}", a[f"{ev}_orbit_share_of_ceiling"] >= 0.08),
            ("events out of cache, share of the ceiling scan", ">= 60%",
             f"{a['events_out_of_cache_orbit_share_of_ceiling']:.1%}",
             a["events_out_of_cache_orbit_share_of_ceiling"] >= 0.6),
            ("tasks (+2 children) vs pt-archiver roots only (--commit-each)", ">= 3x",
             f"{a[f'{ta}_orbit_over_pt_archiver']}x "
             f"(vs its default commit per row: {a.get(f'{ta}_orbit_over_pt_archiver_txn1')}x)",
             a[f"{ta}_orbit_over_pt_archiver"] >= 3),
            ("last fifth of a job vs its first", ">= 0.8", f"{last}", last >= 0.8),
            ("worker peak RSS, 150k-root job minus 10k-root job", "<= 12 MiB",
             f"{a['rss_large_minus_small_mib']} MiB", a["rss_large_minus_small_mib"] <= 12),
        ]  # fmt: skip
    s = docs.get("sender_throughput")
    if s:
        rows.append(
            ("outbox relay vs a direct POST loop", ">= 0.9x", f"{s['relay_over_direct']}x "
             f"(rounds {s['relay_over_direct_min_round']}..{s['relay_over_direct_max_round']})",
             s["relay_over_direct"] >= 0.9)
        )  # fmt: skip
    lat = docs.get("sender_latency")
    if lat:
        rows += [
            ("enqueue -> ACCEPTED p50, one at a time (issue 17)", "<= 100 ms",
             f"{lat['wake_p50_ms']} ms (tick only: {lat['tick_only_p50_ms']} ms)",
             lat["wake_p50_ms"] <= 100),
            ("enqueue -> ACCEPTED p99, one at a time (issue 17)", "<= 500 ms",
             f"{lat['wake_p99_ms']} ms (tick only: {lat['tick_only_p99_ms']} ms)",
             lat["wake_p99_ms"] <= 500),
        ]  # fmt: skip
    t = docs.get("tick_scaling")
    if t:
        rows.append(
            ("tick, 1% of 100k plans due", "< 0.5 s", f"{t['batched_1pct_seconds']} s "
             f"({t['batched_1pct_statements']} statements; per-plan tick "
             f"{t['per_plan_1pct_seconds']} s)", t["batched_1pct_seconds"] < 0.5)
        )  # fmt: skip
    f = docs.get("archive_from_tick")
    if f:
        ev, ta, st = "events_process", "tasks_process", f["start_up_median_s"]
        rows += [
            ("19: events 500k from the tick vs pt-archiver --commit-each", ">= 1.0x",
             f"{f[f'{ev}_over_pt_archiver_commit_each']}x (threads, the previous pipeline: "
             f"{f['events_thread_over_pt_archiver_commit_each']}x)",
             f[f"{ev}_over_pt_archiver_commit_each"] >= 1.0),
            ("19: events 500k from the tick, share of the ordered scan", ">= 12%",
             f"{f[f'{ev}_share_of_ceiling']:.1%}", f[f"{ev}_share_of_ceiling"] >= 0.12),
            ("19: tasks 200k from the tick vs pt-archiver --commit-each", ">= 2.5x",
             f"{f[f'{ta}_over_pt_archiver_commit_each']}x",
             f[f"{ta}_over_pt_archiver_commit_each"] >= 2.5),
            ("19: `orbit archive tick` / `orbit job show` start-up", "<= 0.25 s",
             f"{st['archive_tick']} s / {st['job_show']} s (python -c 'import sqlalchemy': "
             f"{st['python_import_sqlalchemy']} s)",
             max(st["archive_tick"], st["job_show"]) <= 0.25),
        ]  # fmt: skip
    rc = docs.get("replica_check")
    if rc:
        rows += [
            (f"24: the replica check of a {kind} chunk on the primary vs reading it there",
             "< 1x (server time)",
             f"{rc[f'{kind}_server_check_over_read']}x ({rc[f'{kind}_server_check_ms']} ms vs "
             f"{rc[f'{kind}_server_read_ms']} ms per {rc['chunk_roots']} roots)",
             rc[f"{kind}_server_check_over_read"] < 1)
            for kind in ("events", "tasks")
        ]  # fmt: skip
    c = docs.get("archive_catchup")
    if c:
        rows += [
            (f"25: a backlog in budget-sized jobs ({c['sizes']}; {c['catch_up']['jobs']} jobs) "
             "vs pt-archiver --commit-each", ">= 1.0x",
             f"{c['catch_up_over_pt_archiver_commit_each']}x",
             c["catch_up_over_pt_archiver_commit_each"] >= 1.0),
            ("25: the same backlog vs the same rows in one job", ">= 0.85x",
             f"{c['catch_up_over_one_job']}x", c["catch_up_over_one_job"] >= 0.85),
        ]  # fmt: skip
    f = docs.get("archive_find")
    if f:
        hit = f["find_hit"]
        rows.append(
            (f"28: find by id on a job of {f['roots']} roots ({f['batches']} files): files read "
             "per lookup, p50/p99", "3 files",
             f"{hit['files_read_max']} files, {hit['p50_ms']} / {hit['p99_ms']} ms "
             f"(a scan: {f.get('scan_seconds_over_find_p50', '-')}x the p50)",
             hit["files_read_max"] <= 3)
        )  # fmt: skip

    sc = docs.get("archive_scrub")
    if sc:
        cov, bounded = sc["coverage"], sc["scrub"]["bounded"]
        rows += [
            (f"28: coverage of a plan of {cov['jobs']} jobs (one statement, in-process)", "-",
             f"{cov['in_process_median_ms']} ms (the command: {cov['command_wall_s']} s)", True),
            (f"28: scrub read rate vs its bound ({bounded['bound_bytes_per_s']} B/s)", "<= 1.1x",
             f"{bounded['over_bound']}x", bounded["over_bound"] <= 1.1),
        ]  # fmt: skip
    cp = docs.get("console_pages")
    if cp:
        medians = {k[: -len("_median_ms")]: v for k, v in cp.items() if k.endswith("_median_ms")}
        slowest = max(medians, key=lambda k: medians[k])
        rows.append(
            (f"29: console pages, {cp['jobs']} jobs and {cp['outbox_rows']} outbox rows: the "
             "slowest page's median server time (warm; the first fleet page after a start: "
             f"{cp['fleet_cold_ms']} ms)", "<= 200 ms",
             f"{medians[slowest]} ms ({slowest})", medians[slowest] <= 200)
        )  # fmt: skip
    if not rows:
        return []
    out = ["## Targets (issues 8, 17, 19, 24, 25, 28, 29)", "", "| target | wanted | measured | |"]
    out.append("|---|---|---|---|")
    out += [f"| {n} | {w} | {m} | {'met' if ok else 'MISSED'} |" for n, w, m, ok in rows]
    return [*out, ""]


def main(argv: list[str]) -> int:
    render_only = argv == ["--render"]
    unknown = [] if render_only else [n for n in argv if n not in SCRIPTS]
    if unknown:
        print(
            f"bench: unknown benchmark {', '.join(unknown)} "
            f"(allowed {', '.join(SCRIPTS)}, or --render alone)"
        )
        return 2
    failed = []
    for name in [] if render_only else argv or SCRIPTS:
        print(f"bench: running {name} ...", flush=True)
        if subprocess.run([sys.executable, str(BENCH / f"{name}.py")], cwd=BENCH.parent).returncode:
            failed.append(name)
    docs = {name: doc for name in SCRIPTS if (doc := _load(name)) is not None}
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (`bench/run.py`) on {platform.node()} ({platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}). Each benchmark measures "
        "orbit and its alternative in one run: compare the ratios, not absolute rates. The "
        "commands of the alternatives are in each section.",
        "",
        *_targets(docs),
    ]
    for name, doc in docs.items():
        lines += [
            f"## {name}",
            "",
            f"Measured {_when(doc)}.",
            "",
            "| metric | value |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v} |" for k, v in doc.items() if k != "measured_at_unix"]
        lines.append("")
    (BENCH / "RESULTS.md").write_text("\n".join(lines))
    print("bench: results in bench/RESULTS.md")
    if failed:
        print(f"bench: failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
