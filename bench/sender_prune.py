"""``orbit sender prune`` on a large outbox while the application keeps enqueueing (NOT a test).

Real MariaDB (a throw-away database). 100k outbox rows by default: half ACCEPTED and backdated
(prunable), the rest ACCEPTED recently or PENDING. Measures, in one run:
- the prune: seconds, rows pruned per second, pages, and the longest page transaction
  (BEGIN .. COMMIT of one page, seen from the prune's connection);
- an application enqueueing one operation per transaction during the prune: its p50 and max
  commit latency, beside the same without a prune running (no long lock on the table);
- the compact table's size per pruned row, and the outbox's before/after.
Writes bench/sender_prune.json.

    .venv/bin/python bench/sender_prune.py [--rows 100000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, insert, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orbit_tasks.db.business_tables import sender_jobs, sender_outbox  # noqa: E402
from orbit_tasks.db.engine import db_now  # noqa: E402
from orbit_tasks.sender import enqueue, policy  # noqa: E402
from orbit_tasks.sender.retention import prune  # noqa: E402
from tests.support.db import mariadb_database, migrated_engine  # noqa: E402

CHUNK = 5000


def _fill(engine: Engine, rows: int) -> int:
    """``rows`` rows in one namespace: every other one ACCEPTED 8 days ago (prunable)."""
    ns, queue = secrets.token_hex(16), secrets.token_hex(16)
    body = '{"amount": 0.10000000000000000001, "note": "' + "x" * 400 + '"}'
    digest = policy.digest(body)
    prunable = 0
    with engine.begin() as conn:
        now = db_now(conn)
    old = now - dt.timedelta(days=8)
    for start in range(0, rows, CHUNK):
        out, jobs = [], []
        for i in range(start, min(rows, start + CHUNK)):
            op = secrets.token_hex(16)
            kind = i % 4  # 0, 2: ACCEPTED 8 d ago; 1: ACCEPTED now; 3: PENDING
            accepted = kind != 3
            prunable += kind in (0, 2)
            at = old if kind in (0, 2) else now
            out.append(
                {
                    "namespace_id": ns,
                    "queue_id": queue,
                    "operation_id": op,
                    "idempotency_key": "op-" + op,
                    "request_json": body,
                    "request_digest": digest,
                    "state": "ACCEPTED" if accepted else "PENDING",
                    "send_count": 1 if accepted else 0,
                    "lease_epoch": 1 if accepted else 0,
                    "wake_at": None if accepted else now + dt.timedelta(hours=1),
                    "send_deadline_at": at + dt.timedelta(hours=24),
                    "last_code": "ACCEPTED" if accepted else "NEW",
                    "task_id": op if accepted else None,
                    "receipt_json": '{"task_id": "' + op + '", "x": "' + "y" * 200 + '"}'
                    if accepted
                    else None,
                    "created_at": at,
                    "updated_at": at,
                }
            )
            jobs.append(
                {
                    "namespace_id": ns,
                    "operation_id": op,
                    "source_ref": f"orders/{op}",
                    "task_id": op if accepted else None,
                    "created_at": at,
                    "updated_at": at,
                }
            )
        with engine.begin() as conn:
            conn.execute(insert(sender_outbox), out)
            conn.execute(insert(sender_jobs), jobs)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE TABLE sender_outbox, sender_jobs"))
    return prunable


def _enqueue_loop(engine: Engine, stop: threading.Event, latencies: list[float]) -> None:
    ns, queue = secrets.token_hex(16), secrets.token_hex(16)
    while not stop.is_set():
        op = secrets.token_hex(16)
        started = time.perf_counter()
        with engine.begin() as conn:
            enqueue(
                conn,
                namespace_id=ns,
                queue_id=queue,
                operation_id=op,
                request={"order": op},
                source_ref=f"orders/{op}",
            )
        latencies.append(time.perf_counter() - started)
        time.sleep(0.005)


def _pages(engine: Engine) -> list[float]:
    """Durations of the engine's transactions (BEGIN .. COMMIT/ROLLBACK), in seconds."""
    spans: list[float] = []
    begun: dict[int, float] = {}

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        begun[id(conn)] = time.perf_counter()

    def _end(conn: Any) -> None:
        start = begun.pop(id(conn), None)
        if start is not None:
            spans.append(time.perf_counter() - start)

    event.listen(engine, "commit", _end)
    event.listen(engine, "rollback", _end)
    return spans


def _size(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t"
                ),
                {"t": table},
            ).scalar_one()
        )


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    with mariadb_database("orbit_bp") as url, migrated_engine(url, "business") as engine:
        expected = _fill(engine, args.rows)
        with migrated_engine(url, "business") as app_engine:
            quiet: list[float] = []
            stop = threading.Event()
            loop = threading.Thread(target=_enqueue_loop, args=(app_engine, stop, quiet))
            loop.start()
            time.sleep(3)
            stop.set()
            loop.join()
            outbox_before = _size(engine, "sender_outbox")
            busy: list[float] = []
            stop = threading.Event()
            loop = threading.Thread(target=_enqueue_loop, args=(app_engine, stop, busy))
            spans = _pages(engine)
            loop.start()
            started = time.perf_counter()
            report = prune(engine, older_than_seconds=7 * 86400)
            seconds = time.perf_counter() - started
            stop.set()
            loop.join()
        with engine.begin() as conn:
            conn.execute(text("ANALYZE TABLE sender_outbox, sender_pruned"))
        assert report.total == expected, (report.total, expected)
        pruned_bytes = _size(engine, "sender_pruned")
        result = {
            "outbox_rows": args.rows,
            "pruned_rows": report.total,
            "prune_seconds": round(seconds, 2),
            "pruned_rows_per_second": round(report.total / seconds),
            "pages": report.pages,
            "page_transaction_p50_ms": _ms(spans, 0.5),
            "page_transaction_max_ms": _ms(spans, 1.0),
            "enqueue_commit_p50_ms_quiet": _ms(quiet, 0.5),
            "enqueue_commit_max_ms_quiet": _ms(quiet, 1.0),
            "enqueue_commit_p50_ms_during_prune": _ms(busy, 0.5),
            "enqueue_commit_max_ms_during_prune": _ms(busy, 1.0),
            "enqueues_during_prune": len(busy),
            "outbox_bytes_before": outbox_before,
            "sender_pruned_bytes_per_row": round(pruned_bytes / report.total),
            "measured_at_unix": int(time.time()),
        }
        assert statistics.median(busy) < 1.0
    print(json.dumps(result, indent=2))
    (Path(__file__).parent / "sender_prune.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
