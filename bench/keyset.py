"""Keyset pagination on MariaDB: expanded form vs row constructor, in one run (NOT a test).

SPEC §2 records the row-constructor form ``(a, b) > (:a, :b)`` 17x slower than the
expanded ``a > :a OR (a = :a AND b > :b)`` on MariaDB 10.11. This re-measures both on the archive's
real batch query shape (orbit_events, index ix_event_settled) and writes bench/keyset.json.

    .venv/bin/python bench/keyset.py [--roots 100000] [--page 100]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.dev import generator  # noqa: E402
from orbit_tasks.platform import store as platform_store  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine  # noqa: E402

EXPANDED = """SELECT created_at, id FROM orbit_events
 WHERE namespace_id = :ns AND (created_at > :t OR (created_at = :t AND id > :i))
 ORDER BY created_at, id LIMIT :n"""
ROW_CONSTRUCTOR = """SELECT created_at, id FROM orbit_events
 WHERE namespace_id = :ns AND (created_at, id) > (:t, :i)
 ORDER BY created_at, id LIMIT :n"""


def scan(conn, sql: str, ns: bytes, page: int, max_seconds: float) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    t, i = "1970-01-01 00:00:00", b"\0" * 16
    rows = 0
    start = time.perf_counter()
    while time.perf_counter() - start < max_seconds:
        got = conn.execute(text(sql), {"ns": ns, "t": t, "i": i, "n": page}).all()
        if not got:
            break
        rows += len(got)
        t, i = got[-1]
    return rows, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roots", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=100)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    args = parser.parse_args()
    with mariadb_database("orbit_bench_k") as url, migrated_engine(url, "platform") as engine:
        with engine.begin() as conn:
            ns = platform_store.create_namespace(conn, "bench")
            spec = generator.make_spec("events", args.roots, 0, 30, False, 1.0)
            generator.seed_history(conn, spec, ns, [], random.Random(1), db_now(conn))
        with engine.connect() as conn:
            conn.execute(text("ANALYZE TABLE orbit_events"))
            fast_rows, fast_s = scan(conn, EXPANDED, ns, args.page, args.max_seconds)
            slow_rows, slow_s = scan(conn, ROW_CONSTRUCTOR, ns, args.page, args.max_seconds)
    fast, slow = fast_rows / fast_s, slow_rows / slow_s
    result = {
        "roots": args.roots,
        "page": args.page,
        "expanded_rows_per_s": round(fast, 1),
        "row_constructor_rows_per_s": round(slow, 1),
        "expanded_over_row_constructor": round(fast / slow, 2),
        "measured_at_unix": int(time.time()),
    }
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "keyset.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
