"""Restore throughput next to archive throughput for the same job, in one run (NOT a test).

Seeds ``--roots`` settled task roots with ``--children`` attempts each into a fresh MariaDB
platform database, archives them as one job (batch 100, the in-process runner) and restores
that job (the engine of ``orbit job restore``, in process) into:

* an empty MariaDB database (tables made from the manifest): verify + decode check + writes;
* the same database again: every row already present and compared, nothing written;
* a SQLite file.

Rows are roots plus children. Writes bench/restore_throughput.json.

    .venv/bin/python bench/restore_throughput.py [--roots 20000] [--children 2]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine  # noqa: E402

from orbit_tasks.archive.engine import runner  # noqa: E402
from orbit_tasks.archive.engine.volume import job_dir, write_identity  # noqa: E402
from orbit_tasks.archive.jobs import JobState  # noqa: E402
from orbit_tasks.archive.restore import run as restore  # noqa: E402
from orbit_tasks.archive.restore import store as restore_store  # noqa: E402
from orbit_tasks.archive.store import jobs as job_store  # noqa: E402
from orbit_tasks.archive.store import plans as plan_store  # noqa: E402
from orbit_tasks.archive.tick import run_tick  # noqa: E402
from orbit_tasks.db.engine import db_now, make_engine  # noqa: E402
from orbit_tasks.dev import generator  # noqa: E402
from orbit_tasks.ids import new_id  # noqa: E402
from orbit_tasks.platform import store  # noqa: E402
from orbit_tasks.settings import load_settings  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine  # noqa: E402


def _archive(engine: Engine, args: Any, tmp: Path) -> tuple[Any, Path, float]:
    vol = tmp / "vol"
    sid = new_id()
    write_identity(vol, sid, "bench")
    with engine.begin() as conn:
        store.register_storage(conn, sid, "bench")
        ns = store.create_namespace(conn, "bench-restore")
        queue = store.create_queue(conn, ns, "default")
        spec = generator.make_spec("tasks", args.roots, args.children, 30, False, 1.0)
        generator.seed_history(conn, spec, ns, [queue], random.Random(1), db_now(conn))
        rev = store.add_policy_revision(conn, ns, "tasks", 3600, "bench")
        plan_store.set_plan(
            conn, ns, "tasks", storage_id=sid, interval=86400, batch_size=100,
            max_bytes=1024**3, policy_revision=rev, enabled=True, expect_revision=None,
            now=db_now(conn), actor="bench",
        )  # fmt: skip
    settings = load_settings({"ORBIT_DATABASE_URL": str(engine.url), "ORBIT_VAR_DIR": str(tmp)})
    report = run_tick(engine, settings, publish=lambda *a, **k: None)
    job_hex = report.jobs_created[0][2]
    start = time.perf_counter()
    out = None
    while out in (None, "released"):
        out = runner.run_job(
            ns.hex(), job_hex, {sid.hex(): vol}, settings, engine=engine,
            publish=lambda *a, **k: None,
        )  # fmt: skip
    secs = time.perf_counter() - start
    with engine.connect() as conn:
        job = job_store.require_job(conn, ns, bytes.fromhex(job_hex))
    assert job.state is JobState.SUCCEEDED and job.roots == args.roots, job
    return job, job_dir(vol, ns, job.id), secs


def _restore(platform: Engine, job: Any, directory: Path, url: str) -> dict[str, float]:
    target = make_engine(url)
    restore_store.strict_sessions(target)
    try:
        t0 = time.perf_counter()
        archive = restore.open_job(platform, job, directory)
        t1 = time.perf_counter()
        restore.check_rows(archive)
        t2 = time.perf_counter()
        result = restore.restore_job(target, archive)
        t3 = time.perf_counter()
    finally:
        target.dispose()
    assert not result.conflicts and result.roots == job.roots, result
    return {"verify": t1 - t0, "check": t2 - t1, "write": t3 - t2, "total": t3 - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roots", type=int, default=20_000)
    parser.add_argument("--children", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="orbit-bench-restore-"))
    rows = args.roots * (1 + args.children)
    result: dict[str, Any] = {"roots": args.roots, "rows": rows, "batch_size": 100}
    try:
        with mariadb_database("orbit_bench_r") as url, migrated_engine(url, "platform") as engine:
            job, directory, archive_secs = _archive(engine, args, tmp)
            result["archive_rows_per_s"] = round(rows / archive_secs)
            with mariadb_database("orbit_bench_t") as target_url:
                first = _restore(engine, job, directory, target_url)
                again = _restore(engine, job, directory, target_url)
            lite = _restore(engine, job, directory, f"sqlite:///{tmp / 'restore.sqlite3'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the volume and the SQLite target (~20 MB)
    result["restore_mariadb_rows_per_s"] = round(rows / first["total"])
    result["restore_mariadb_write_rows_per_s"] = round(rows / first["write"])
    result["restore_mariadb_seconds_verify_check_write"] = [
        round(first[k], 2) for k in ("verify", "check", "write")
    ]
    result["restore_again_all_present_rows_per_s"] = round(rows / again["total"])
    result["restore_sqlite_rows_per_s"] = round(rows / lite["total"])
    result["ratio_restore_vs_archive_mariadb"] = round(
        result["restore_mariadb_rows_per_s"] / result["archive_rows_per_s"], 2
    )
    result["measured_at_unix"] = int(time.time())
    out_path = ROOT / "bench" / "restore_throughput.json"
    out_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
