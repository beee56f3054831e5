"""The replica check's cost on the primary (issue 24 item 1), in one run (NOT a test).

Reading from a replica is worth it only if checking a chunk against the primary costs the primary
much less than reading the chunk there. For each kind, on chunks of ``--chunk`` roots (the
read-ahead's largest query, ``claims.MAX_READ_AHEAD_ROOTS``; a chunk is one or more batches),
in cache, median of the chunks of one pass:

* ``read_ms``: the hot read of the chunk (``source.read_chunk``: roots and children) -- what the
  primary would serve without a replica -- as the worker waits for it;
* ``check_ms``: the check's statement on the primary (``source_check.primary_digests``: count and
  digests of every table over the key range, no row sent), as the worker waits for it;
* ``server_read_ms`` / ``server_check_ms``: the same, as the server's own profile of the
  statements says (``SHOW PROFILES``: the primary's time, without the network and the driver);
* ``python_digest_ms``: the worker's digest of the rows it read (the alternative, the same
  statement on the replica, costs ``check_ms`` there again).

Writes bench/replica_check.json.

    .venv/bin/python bench/replica_check.py [--roots 20000] [--chunk 1000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orbit_tasks.archive.ranges import ArchiveRange  # noqa: E402
from orbit_tasks.archive.store import source, source_check  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.dev import generator  # noqa: E402
from orbit_tasks.platform import store as platform_store  # noqa: E402
from orbit_tasks.platform.history import history_kind  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine  # noqa: E402


def _ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 2)


def measure(engine, kind: str, roots: int, chunk: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        ns = platform_store.create_namespace(conn, f"bench-{kind}")
        queue = platform_store.create_queue(conn, ns, "default")
        spec = generator.make_spec(kind, roots, None, 30, False, 1.0)
        generator.seed_history(conn, spec, ns, [queue], random.Random(1), db_now(conn))
    hk = history_kind(kind)
    names = [hk.root.name, *(c.table.name for c in hk.children)]
    with engine.connect() as conn:
        for name in names:
            conn.execute(text(f"ANALYZE TABLE {name}"))
        rng = ArchiveRange(None, db_now(conn))
        conn.commit()
        conn.execute(text("SET profiling_history_size = 100"))
        conn.execute(text("SET profiling = 1"))  # the server's own duration of each statement
        conn.commit()
        for _ in range(2):  # the first pass warms the cache; the second is measured
            reads, checks, digests, server_reads, server_checks = [], [], [], [], []
            cursor = None
            seen = 0
            while True:
                t0 = time.perf_counter()
                with conn.begin():
                    got = source.read_chunk(conn, kind, ns, rng, cursor, chunk)
                t1 = time.perf_counter()
                through = got.cursor if got.has_more else None
                with conn.begin():
                    want = source_check.primary_digests(conn, kind, ns, rng, cursor, through)
                t2 = time.perf_counter()
                mine = source_check.chunk_digests(kind, got)
                t3 = time.perf_counter()
                assert mine == {n: want.get(n, source_check.Digest()) for n in mine}, kind
                profiles = [
                    (int(qid), float(duration), str(query))
                    for qid, duration, query in conn.execute(text("SHOW PROFILES")).all()
                ]
                conn.commit()
                mine_now = [
                    p
                    for p in profiles
                    if p[0] > seen and p[2].lstrip().upper().startswith("SELECT")
                ]
                seen = max((p[0] for p in profiles), default=seen)
                if len(got.roots) == chunk:  # whole chunks only
                    reads.append(t1 - t0)
                    checks.append(t2 - t1)
                    digests.append(t3 - t2)
                    server_checks.append(sum(d for _, d, q in mine_now if "crc32" in q.lower()))
                    server_reads.append(sum(d for _, d, q in mine_now if "crc32" not in q.lower()))
                if not got.has_more:
                    break
                cursor = got.cursor
    read, check = _ms(reads), _ms(checks)
    server_read, server_check = _ms(server_reads), _ms(server_checks)
    return {
        f"{kind}_chunks": len(reads),
        f"{kind}_read_ms": read,
        f"{kind}_check_ms": check,
        f"{kind}_check_over_read": round(check / read, 3),
        f"{kind}_server_read_ms": server_read,
        f"{kind}_server_check_ms": server_check,
        f"{kind}_server_check_over_read": round(server_check / server_read, 3),
        f"{kind}_python_digest_ms": _ms(digests),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roots", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=1000)
    args = parser.parse_args()
    result: dict[str, object] = {"roots_per_kind": args.roots, "chunk_roots": args.chunk}
    with mariadb_database("orbit_bench_rc") as url, migrated_engine(url, "platform") as engine:
        for kind in ("events", "tasks"):
            result.update(measure(engine, kind, args.roots, args.chunk))
    result["measured_at_unix"] = int(time.time())
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "replica_check.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
