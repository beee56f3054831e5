"""Outbox relay throughput vs a direct POST loop at the same concurrency (NOT a test).

Both sides talk to the same real API subprocess over HTTP with one shared httpx client and the
same number of threads. The relay additionally claims every row (compare-and-set), checks the
digest and identity, and writes a fenced outcome (two extra MariaDB transactions per row), so the
ratio is the price of the outbox's guarantees. Prints both rates and the ratio, and writes them to
bench/sender_throughput.json.

    .venv/bin/python bench/sender_throughput.py [--rows 2000] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orbit_tasks.platform import store as platform_store  # noqa: E402
from orbit_tasks.sender.client import PlatformClient  # noqa: E402
from tests.api_server import running_api_server  # noqa: E402
from tests.dbutil import mariadb_database, migrated_engine  # noqa: E402
from tests.sender_support import body_for, enqueue_many, make_relay, open_count  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    n, conc = args.rows, args.concurrency
    with (
        mariadb_database("orbit_bench_p") as purl,
        migrated_engine(purl, "platform") as platform,
        mariadb_database("orbit_bench_b") as burl,
        migrated_engine(burl, "business") as business,
    ):
        with platform.begin() as conn:
            ns = platform_store.create_namespace(conn, "bench-" + secrets.token_hex(3))
            queues = [platform_store.create_queue(conn, ns, f"q{i}") for i in range(4)]
            _, token = platform_store.create_credential(conn, ns, None)
        with running_api_server(purl, log_level="warning") as api:
            client = PlatformClient(api.base_url, token, timeout_seconds=10, max_connections=conc)
            qhex = [q.hex() for q in queues]

            def post(i: int) -> int:
                key = "bench-" + secrets.token_hex(16)
                body = body_for(i).encode()
                return client.submit(ns.hex(), qhex[i % len(qhex)], key, body).status or 0

            with ThreadPoolExecutor(conc) as pool:
                list(pool.map(post, range(200)))  # warm-up: connections, caches
                t0 = time.perf_counter()
                statuses = list(pool.map(post, range(n)))
                direct_s = time.perf_counter() - t0
            assert statuses.count(201) == n, "direct POSTs failed"

            enqueue_many(business, ns.hex(), qhex, n)
            relay = make_relay(
                business, api.base_url, token, lease=60, timeout=10, concurrency=conc
            )
            t0 = time.perf_counter()
            while open_count(business):
                relay.run_pass(max_claims=n, budget_seconds=600)
            relay_s = time.perf_counter() - t0
            relay.client.close()
            client.close()
    direct_rate, relay_rate = n / direct_s, n / relay_s
    result = {
        "rows": n,
        "concurrency": conc,
        "direct_posts_per_s": round(direct_rate, 1),
        "relay_rows_per_s": round(relay_rate, 1),
        "relay_over_direct": round(relay_rate / direct_rate, 3),
        "measured_at_unix": int(time.time()),
    }
    print(f"direct POST loop : {direct_rate:8.1f} requests/s ({n} in {direct_s:.2f} s)")
    print(f"outbox relay     : {relay_rate:8.1f} rows/s     ({n} in {relay_s:.2f} s)")
    print(f"ratio relay/direct: {relay_rate / direct_rate:.3f} (concurrency {conc})")
    (ROOT / "bench" / "sender_throughput.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
