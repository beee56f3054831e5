"""Outbox relay throughput vs a direct POST loop at the same concurrency (NOT a test).

Both sides talk to the same real API subprocess over HTTP with the same client class and the same
number of threads. The relay additionally claims every row (compare-and-set), checks the digest
and identity before sending, and writes a fenced outcome (business-database transactions shared
by a page of rows), so the ratio is the price of the outbox's guarantees.

The machine is shared, so the two sides run in interleaved rounds (direct, relay, relay, direct,
...) and the ratio is taken over the totals; the per-round ratios show the spread. Prints the
rates and writes them to bench/sender_throughput.json.

    .venv/bin/python bench/sender_throughput.py [--rows 3000] [--rounds 6] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orbit_tasks.platform import store as platform_store  # noqa: E402
from orbit_tasks.sender.client import PlatformClient  # noqa: E402
from tests.support.api_server import running_api_server  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine  # noqa: E402
from tests.support.sender import body_for, enqueue_many, make_relay, open_count  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3000, help="rows per side, over all rounds")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per side (even)")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    conc, rounds = args.concurrency, max(2, args.rounds // 2 * 2)
    per_round = max(1, args.rows // rounds)
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
        qhex = [q.hex() for q in queues]
        with running_api_server(purl, log_level="warning") as api:
            client = PlatformClient(api.base_url, token, timeout_seconds=10, max_connections=conc)
            relay = make_relay(
                business, api.base_url, token, lease=60, timeout=10, concurrency=conc
            )
            pool = ThreadPoolExecutor(conc)

            def post(i: int) -> int:
                key = "bench-" + secrets.token_hex(16)
                body = body_for(i).encode()
                return client.submit(ns.hex(), qhex[i % len(qhex)], key, body).status or 0

            def direct_round() -> float:
                t0 = time.perf_counter()
                statuses = list(pool.map(post, range(per_round)))
                elapsed = time.perf_counter() - t0
                assert statuses.count(201) == per_round, "direct POSTs failed"
                return elapsed

            def relay_round() -> float:
                enqueue_many(business, ns.hex(), qhex, per_round)
                t0 = time.perf_counter()
                while open_count(business):
                    relay.run_pass(max_claims=per_round, budget_seconds=600)
                return time.perf_counter() - t0

            list(pool.map(post, range(200)))  # warm-up: connections, caches
            relay_round()
            direct_s: list[float] = []
            relay_s: list[float] = []
            for r in range(rounds):
                # ABBA order: neither side always runs first after the other
                sides = ("direct", "relay") if r % 2 == 0 else ("relay", "direct")
                for side in sides:
                    if side == "direct":
                        direct_s.append(direct_round())
                    else:
                        relay_s.append(relay_round())
                print(
                    f"round {r + 1}/{rounds}: direct {per_round / direct_s[-1]:7.1f}/s  "
                    f"relay {per_round / relay_s[-1]:7.1f}/s",
                    flush=True,
                )
            pool.shutdown()
            relay.client.close()
            client.close()
    n = per_round * rounds
    direct_rate, relay_rate = n / sum(direct_s), n / sum(relay_s)
    per_round_ratios = [d / r for d, r in zip(direct_s, relay_s, strict=True)]
    result = {
        "rows_per_side": n,
        "rounds": rounds,
        "concurrency": conc,
        "direct_posts_per_s": round(direct_rate, 1),
        "relay_rows_per_s": round(relay_rate, 1),
        "relay_over_direct": round(relay_rate / direct_rate, 3),
        "relay_over_direct_median_round": round(statistics.median(per_round_ratios), 3),
        "relay_over_direct_min_round": round(min(per_round_ratios), 3),
        "relay_over_direct_max_round": round(max(per_round_ratios), 3),
        "measured_at_unix": int(time.time()),
    }
    print(f"direct POST loop : {direct_rate:8.1f} requests/s ({n} in {sum(direct_s):.2f} s)")
    print(f"outbox relay     : {relay_rate:8.1f} rows/s     ({n} in {sum(relay_s):.2f} s)")
    print(
        f"ratio relay/direct: {relay_rate / direct_rate:.3f} (concurrency {conc}; per round "
        f"{min(per_round_ratios):.3f}..{max(per_round_ratios):.3f})"
    )
    (ROOT / "bench" / "sender_throughput.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
