"""Issue 28 items 2 and 3: coverage of a plan of 1,000 jobs, and the scrub's read rate against
its bound (NOT a test).

On the shared MariaDB server (a fresh database, dropped after), in one run:

* **coverage**: a plan with ``--jobs`` (default 1,000) SUCCEEDED jobs of consecutive recorded
  ends, half of them with a scrub row holding the range of their manifest; ``plan_coverage`` (what
  ``orbit archive coverage NS KIND`` prints: one statement for the jobs, the backlog's range and
  count) timed in-process (median of ``--repeat``) and the command itself once (start-up
  included).
* **scrub rate**: ``--events`` settled event roots archived as one job by the real runner
  (in-process), then re-verified by :func:`scrub_storage` with the bound at ``--rate`` (default
  256 KiB/s, below the verifier's own speed on a shared machine, so that the bound is what
  limits it) and at 1 GiB/s (the verifier's own speed on this machine): bytes read over wall time.

    .venv/bin/python bench/archive_scrub.py [--jobs 1000] [--events 40000] [--rate 256KiB]

Writes bench/archive_scrub.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import insert, select  # noqa: E402

from orbit_tasks.archive.engine import runner  # noqa: E402
from orbit_tasks.archive.engine.scrub import scrub_storage  # noqa: E402
from orbit_tasks.archive.engine.volume import write_identity  # noqa: E402
from orbit_tasks.archive.store import plans as plan_store  # noqa: E402
from orbit_tasks.archive.store import source  # noqa: E402
from orbit_tasks.archive.tick import run_tick  # noqa: E402
from orbit_tasks.cli.coverage import plan_coverage  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.db.platform_tables import (  # noqa: E402
    archive_job_ends,
    archive_jobs,
    archive_scrubs,
)
from orbit_tasks.dev import generator  # noqa: E402
from orbit_tasks.ids import new_id  # noqa: E402
from orbit_tasks.platform import store  # noqa: E402
from orbit_tasks.platform.history import HISTORY_KINDS  # noqa: E402
from orbit_tasks.settings import load_settings  # noqa: E402
from orbit_tasks.units import parse_size  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine  # noqa: E402

MIB = 1024 * 1024


def _plan(engine: Any, name: str, kind: str, storage: bytes, max_bytes: int) -> bytes:
    with engine.begin() as conn:
        ns = store.create_namespace(conn, name)
        rev = store.add_policy_revision(conn, ns, kind, 3600, "bench")
        plan_store.set_plan(
            conn, ns, kind, storage_id=storage, interval=86400, batch_size=100,
            max_bytes=max_bytes, policy_revision=rev, enabled=True, expect_revision=None,
            now=db_now(conn), actor="bench",
        )  # fmt: skip
    return ns


def seed_jobs(engine: Any, ns: bytes, storage: bytes, count: int) -> None:
    """``count`` SUCCEEDED jobs created a minute apart, each ending a minute after the one
    before (recorded ends); every other one with a scrub row holding its manifest's range."""
    with engine.begin() as conn:
        now = db_now(conn)
    start = now - dt.timedelta(days=30)
    jobs, ends, scrubs = [], [], []
    for i in range(count):
        job_id, created = new_id(), start + dt.timedelta(minutes=i)
        end = start - dt.timedelta(days=1) + dt.timedelta(minutes=i + 1)
        jobs.append(dict(
            namespace_id=ns, id=job_id, kind="events", plan_revision=1, policy_revision=1,
            storage_id=storage, batch_size=100, max_bytes=MIB, state="SUCCEEDED", roots=1000,
            batches=10, bytes=100_000, last_sha256="ab" * 32, created_at=created,
            updated_at=created + dt.timedelta(seconds=20),
        ))  # fmt: skip
        ends.append(dict(
            namespace_id=ns, job_id=job_id, range_until=end, until_id=None, policy_until=end,
            roots_total=1000, sample_roots=100, sample_bytes=10_000,
        ))  # fmt: skip
        if i % 2:
            scrubs.append(dict(
                namespace_id=ns, job_id=job_id, storage_id=storage, checked_at=now, outcome="ok",
                verified_at=now, files_read=11, bytes_read=100_000, read_ms=50, failures=0,
                range_from=end - dt.timedelta(minutes=1), range_until=end,
            ))  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(archive_jobs), jobs)
        conn.execute(insert(archive_job_ends), ends)
        conn.execute(insert(archive_scrubs), scrubs)


def coverage(engine: Any, url: str, ns: bytes, repeat: int) -> dict[str, Any]:
    def once() -> dict[str, Any]:
        with engine.connect() as conn:
            plan = plan_store.get_plan(conn, ns, "events")
            assert plan is not None
            return plan_coverage(
                conn, plan, "cov", {},
                lambda c, p, rng: source.count_roots(c, p.kind, p.namespace_id, rng),
            )  # fmt: skip

    doc = once()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        once()
        times.append(time.perf_counter() - began)
    env = {"ORBIT_DATABASE_URL": url, "PATH": "/usr/bin:/bin"}
    began = time.perf_counter()
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "orbit"), "archive", "coverage", "cov", "events", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    command = time.perf_counter() - began
    assert proc.returncode == 0, proc.stderr
    return {
        "jobs": len(doc["ranges"]),
        "gaps": len(doc["gaps"]),
        "proven_by_scrub": sum(r["range_source"] == "scrub" for r in doc["ranges"]),
        "in_process_median_ms": round(1000 * statistics.median(times), 1),
        "command_wall_s": round(command, 2),
    }


def scrub_rate(engine: Any, url: str, tmp: Path, events: int, rate: int) -> dict[str, Any]:
    vol = tmp / "vol"
    storage = new_id()
    write_identity(vol, storage, "bench")
    with engine.begin() as conn:
        store.register_storage(conn, storage, "bench")
    ns = _plan(engine, "rate", "events", storage, 1024**3)
    spec = generator.make_spec("events", events, days=2, settled_fraction=1.0)
    hk = HISTORY_KINDS["events"]
    with engine.begin() as conn:
        for chunk in generator.generate(spec, ns, [], random.Random(1), db_now(conn)):
            generator.insert_chunk(conn, hk, chunk)
    settings = load_settings({"ORBIT_DATABASE_URL": url, "ORBIT_VAR_DIR": str(tmp / "var")})
    woken: list[tuple[str, str]] = []
    run_tick(engine, settings, lambda s, n, j, **_: woken.append((n.hex(), j.hex())))
    while woken:
        n, j = woken.pop(0)
        runner.run_job(n, j, {storage.hex(): vol}, settings, engine=engine,
                       publish=lambda s, n, j, **_: woken.append((n.hex(), j.hex())))  # fmt: skip
    with engine.connect() as conn:
        job_id, size = conn.execute(select(archive_jobs.c.id, archive_jobs.c.bytes)
                                    .where(archive_jobs.c.namespace_id == ns)).one()  # fmt: skip
    out: dict[str, Any] = {"job_bytes": int(size)}
    for label, bound in (("bounded", rate), ("unbounded_1GiB", 1024**3)):
        s = settings.with_overrides(archive_scrub_bytes_per_second=bound)
        began = time.perf_counter()
        report = scrub_storage(engine, storage, vol, s, namespace_id=ns, job_id=bytes(job_id))
        wall = time.perf_counter() - began
        (result,) = report.results
        assert result.outcome.value == "ok", result
        out[label] = {
            "bound_bytes_per_s": bound,
            "bytes_read": result.bytes_read,
            "wall_s": round(wall, 3),
            "bytes_per_s": round(result.bytes_read / wall),
            "over_bound": round(result.bytes_read / wall / bound, 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--rate", default="256KiB")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with (
        mariadb_database("orbit_bench_scrub") as url,
        migrated_engine(url, "platform") as engine,
        tempfile.TemporaryDirectory(prefix="orbit-bench-scrub-") as tmp,
    ):
        storage = new_id()
        with engine.begin() as conn:
            store.register_storage(conn, storage, "cov")
        ns = _plan(engine, "cov", "events", storage, MIB)
        seed_jobs(engine, ns, storage, args.jobs)
        result = {
            "coverage": coverage(engine, url, ns, args.repeat),
            "scrub": scrub_rate(engine, url, Path(tmp), args.events, parse_size(args.rate)),
            "measured_at_unix": int(time.time()),
        }
    out = Path(__file__).with_suffix(".json")
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
