"""Issue 28 item 1: find an archived root by id on a job of 1M roots (NOT a test).

Seeds ``--roots`` settled event roots with random (not time-ordered) ids into a fresh MariaDB
platform database (``orbit dev seed-history --random-ids``), archives them as one job (batch
100, the in-process runner: 10,000 batch files on a folder), builds the job's id index (the
engine of ``orbit archive index``: the whole chain verified while read once), then in one run:

* **find**: ``--lookups`` ids drawn from the archived roots and ``--misses`` ids never archived,
  each looked up through the index (the engine of ``orbit archive find``, in process): latency
  p50/p99 and the files read per lookup; and ``orbit archive find`` end to end for three ids
  (the command's start-up included);
* **scan**: the alternative without an index -- ``orbit job export``'s streaming (the chain
  verified, then every root decoded until the id appears) -- for ``--scans`` ids, one from the
  middle of the job and one never archived.

    .venv/bin/python bench/archive_find.py [--roots 1000000] [--lookups 300] [--misses 50]

Writes bench/archive_find.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, select  # noqa: E402

from orbit_tasks.archive.engine import index as engine_index  # noqa: E402
from orbit_tasks.archive.engine import runner  # noqa: E402
from orbit_tasks.archive.engine.storage import FolderStorage  # noqa: E402
from orbit_tasks.archive.engine.verify import export_roots  # noqa: E402
from orbit_tasks.archive.engine.volume import write_identity  # noqa: E402
from orbit_tasks.archive.jobs import Job, JobState  # noqa: E402
from orbit_tasks.archive.store import jobs as job_store  # noqa: E402
from orbit_tasks.archive.store import plans as plan_store  # noqa: E402
from orbit_tasks.archive.tick import run_tick  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.db.history_tables import events  # noqa: E402
from orbit_tasks.dev import generator  # noqa: E402
from orbit_tasks.ids import new_id, random_id  # noqa: E402
from orbit_tasks.platform import store  # noqa: E402
from orbit_tasks.settings import load_settings  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine  # noqa: E402

ORBIT = str(ROOT / ".venv" / "bin" / "orbit")


def _archive(engine: Engine, roots: int, tmp: Path) -> tuple[Job, Path, dict[str, float]]:
    vol = tmp / "vol"
    sid = new_id()
    write_identity(vol, sid, "bench")
    t0 = time.perf_counter()
    with engine.begin() as conn:
        store.register_storage(conn, sid, "bench")
        ns = store.create_namespace(conn, "bench-find")
        queue = store.create_queue(conn, ns, "default")
        rev = store.add_policy_revision(conn, ns, "events", 3600, "bench")
        plan_store.set_plan(
            conn, ns, "events", storage_id=sid, interval=86400, batch_size=100,
            max_bytes=1024**3, policy_revision=rev, enabled=True, expect_revision=None,
            now=db_now(conn), actor="bench",
        )  # fmt: skip
    rng = random.Random(1)
    left = roots
    while left:
        n = min(left, 100_000)
        spec = generator.make_spec("events", n, 0, 30, True, 1.0)
        with engine.begin() as conn:
            generator.seed_history(conn, spec, ns, [queue], rng, db_now(conn))
        left -= n
        print(f"bench: seeded {roots - left}/{roots} events", flush=True)
    t1 = time.perf_counter()
    settings = load_settings({"ORBIT_DATABASE_URL": str(engine.url), "ORBIT_VAR_DIR": str(tmp)})
    report = run_tick(engine, settings, publish=lambda *a, **k: None)
    job_hex = report.jobs_created[0][2]
    out = None
    while out in (None, "released"):
        out = runner.run_job(
            ns.hex(), job_hex, {sid.hex(): vol}, settings, engine=engine,
            publish=lambda *a, **k: None,
        )  # fmt: skip
    t2 = time.perf_counter()
    with engine.connect() as conn:
        job = job_store.require_job(conn, ns, bytes.fromhex(job_hex))
    assert job.state is JobState.SUCCEEDED and job.roots == roots, job
    print(f"bench: archived {job.roots} roots in {job.batches} files ({t2 - t1:.0f}s)", flush=True)
    return job, vol, {"seed": t1 - t0, "archive": t2 - t1}


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def _lookups(engine: Engine, storage: FolderStorage, job: Job, ids: list[bytes]) -> dict[str, Any]:
    jobs = engine_index.indexed_jobs(engine, job.namespace_id, job.kind)
    seconds, reads, found = [], [], 0
    for rid in ids:
        t0 = time.perf_counter()
        search = engine_index.find_root(jobs, lambda _j: storage, rid)
        seconds.append(time.perf_counter() - t0)
        reads.append(len(search.reads.names))
        found += search.found is not None
    return {
        "n": len(ids), "found": found, "p50_ms": _ms(seconds, 0.5), "p99_ms": _ms(seconds, 0.99),
        "files_read_min": min(reads), "files_read_max": max(reads),
    }  # fmt: skip


def _scan(storage: FolderStorage, job: Job, engine: Engine, rid: bytes) -> tuple[float, bool]:
    """``orbit job export``'s streaming, stopped at the id: the chain verified, then decoded."""
    jf = storage.job(job.namespace_id, job.id)
    want = rid.hex()
    t0 = time.perf_counter()
    hit = any(
        obj["root"]["id"] == want
        for obj in export_roots(jf, engine_index.expectation_of(engine, job))
    )
    return time.perf_counter() - t0, hit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roots", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=300)
    parser.add_argument("--misses", type=int, default=50)
    parser.add_argument("--scans", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="orbit-bench-find-"))
    result: dict[str, Any] = {"roots": args.roots, "batch_size": 100}
    try:
        with mariadb_database("orbit_bench_f") as url, migrated_engine(url, "platform") as engine:
            job, vol, phases = _archive(engine, args.roots, tmp)
            result["batches"] = job.batches
            result["seed_seconds"] = round(phases["seed"], 1)
            result["archive_seconds"] = round(phases["archive"], 1)
            storage = FolderStorage(vol)
            t0 = time.perf_counter()
            built = engine_index.build_index(engine, storage, job)
            result["index_build_seconds"] = round(time.perf_counter() - t0, 1)
            index_dir = vol / job.namespace_id.hex() / f"{job.id.hex()}.index"
            sizes = {p.name: p.stat().st_size for p in index_dir.iterdir()}
            result["index_shards"] = built.row.shards
            result["index_top_bytes"] = sizes[f"index-{built.row.index_sha256}.json"]
            result["index_total_bytes"] = sum(sizes.values())
            print(f"bench: index built in {result['index_build_seconds']}s", flush=True)

            with engine.connect() as conn:
                all_ids = [
                    bytes(r[0])
                    for r in conn.execute(
                        select(events.c.id).where(events.c.namespace_id == job.namespace_id)
                    )
                ]
            rng = random.Random(2)
            hits = rng.sample(all_ids, min(args.lookups, len(all_ids)))
            misses = [random_id() for _ in range(args.misses)]
            _lookups(engine, storage, job, hits[:20])  # warm: imports, the page cache
            result["find_hit"] = _lookups(engine, storage, job, hits)
            result["find_miss"] = _lookups(engine, storage, job, misses)
            assert result["find_hit"]["found"] == len(hits)
            assert result["find_miss"]["found"] == 0

            env = dict(os.environ, ORBIT_DATABASE_URL=url)
            cli = []
            for rid in hits[:3]:
                t0 = time.perf_counter()
                proc = subprocess.run(
                    [ORBIT, "archive", "find", job.namespace_id.hex(), "events", rid.hex(),
                     "--volume", str(vol), "--json"],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                cli.append(time.perf_counter() - t0)
                assert json.loads(proc.stdout)["files_read"] == 3
            result["find_cli_seconds_median"] = round(statistics.median(cli), 2)

            scans = []
            for rid in [hits[0], misses[0]][: args.scans]:
                secs, hit = _scan(storage, job, engine, rid)
                scans.append({"seconds": round(secs, 1), "found": hit})
                print(f"bench: scan {rid.hex()} {secs:.1f}s found={hit}", flush=True)
            result["scan"] = scans
            result["scan_files_read_per_lookup"] = (
                f"{job.batches + 1} verified, then up to {job.batches} decoded"
            )
            if scans:
                result["scan_seconds_over_find_p50"] = round(
                    statistics.median(s["seconds"] for s in scans)
                    / (result["find_hit"]["p50_ms"] / 1000)
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["measured_at_unix"] = int(time.time())
    out_path = ROOT / "bench" / "archive_find.json"
    out_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
