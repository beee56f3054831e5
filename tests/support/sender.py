"""Fixtures and checks shared by the sender integration tests (tests/integration/test_sender_*).

``world`` (module scope): a migrated platform database on MariaDB with two namespaces, queues and
credentials, and the real reference API as a subprocess. ``business`` (per test): a fresh migrated
business database. ``check_invariants`` is the fault-test oracle of SPEC §10: every row ACCEPTED or
REVIEW, at most one platform task per key, and each receipt equal to the platform's original.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, text

from orbit_tasks.db.engine import DB_CLOCK, Clock, db_now
from orbit_tasks.db.history_tables import idempotency_records, tasks
from orbit_tasks.platform import store as platform_store
from orbit_tasks.sender import enqueue
from orbit_tasks.sender.client import PlatformClient
from orbit_tasks.sender.relay import Relay
from tests.support.api_server import ApiServer, running_api_server
from tests.support.db import mariadb_database, migrated_engine, redis_url

REPO = Path(__file__).resolve().parents[2]
CELERY = REPO / ".venv" / "bin" / "celery"
SENDER_REDIS_DB = 3
REDIS_URL = redis_url(SENDER_REDIS_DB)


class Workers:
    """``celery worker -Q orbit.sender`` processes, each in its own process group, logging to
    a file of the test's folder (the ``workers`` fixture)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(CELERY),
                    "-A",
                    "orbit_tasks.celery_app",
                    "worker",
                    "-Q",
                    "orbit.sender",
                    "-c",
                    "1",
                    "-P",
                    "prefork",
                    "--without-heartbeat",
                    "--without-gossip",
                    "--without-mingle",
                    "-l",
                    "INFO",
                    "-n",
                    f"{name}-{os.getpid()}@%h",
                ],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append((proc, log))
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and its pool children (its own process group)."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def outputs(self) -> list[str]:
        return [log.read_text(errors="replace") for _, log in self.procs]

    def output(self) -> str:
        return "\n".join(self.outputs())


@dataclass
class World:
    platform_url: str
    platform: Engine
    api: ApiServer
    ns: str
    queues: list[str]
    token: str  # all queues of ns
    token_q0: str  # only queues[0]
    other_ns: str
    other_queue: str
    other_token: str


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with (
        mariadb_database("orbit_sp") as url,
        migrated_engine(url, "platform") as engine,
    ):
        with engine.begin() as conn:
            ns = platform_store.create_namespace(conn, "acme-" + secrets.token_hex(3))
            queues = [platform_store.create_queue(conn, ns, f"q{i}") for i in range(3)]
            _, token = platform_store.create_credential(conn, ns, None)
            _, token_q0 = platform_store.create_credential(conn, ns, [queues[0].hex()])
            other = platform_store.create_namespace(conn, "other-" + secrets.token_hex(3))
            other_q = platform_store.create_queue(conn, other, "q0")
            _, other_token = platform_store.create_credential(conn, other, None)
        with running_api_server(url, log_level="warning") as api:
            yield World(
                url,
                engine,
                api,
                ns.hex(),
                [q.hex() for q in queues],
                token,
                token_q0,
                other.hex(),
                other_q.hex(),
                other_token,
            )


@pytest.fixture
def business() -> Iterator[tuple[str, Engine]]:
    with mariadb_database("orbit_sb") as url, migrated_engine(url, "business") as engine:
        yield url, engine


def new_op() -> str:
    return secrets.token_hex(16)


def body_for(i: int) -> str:
    """A body with exact numbers and 4-byte characters, as text."""
    return (
        f'{{"amount": 0.1000000000000000000{i % 10}1, "big": 12345678901234567890123{i}, '
        f'"i": {i}, "note": "😀 é {i}"}}'
    )


def enqueue_many(engine: Engine, ns: str, queues: list[str], n: int) -> list[str]:
    ops = []
    with engine.begin() as conn:
        for i in range(n):
            op = new_op()
            enqueue(
                conn,
                namespace_id=ns,
                queue_id=queues[i % len(queues)],
                operation_id=op,
                request=body_for(i),
                source_ref=f"orders/{i}",
            )
            ops.append(op)
    return ops


def make_relay(
    engine: Engine,
    url: str,
    token: str,
    *,
    lease: int = 10,
    timeout: float = 2.0,
    concurrency: int = 4,
    clock: Clock = DB_CLOCK,
) -> Relay:
    client = PlatformClient(url, token, timeout_seconds=timeout, max_connections=concurrency)
    return Relay(
        engine,
        client,
        lease_seconds=lease,
        timeout_seconds=timeout,
        concurrency=concurrency,
        clock=clock,
    )


def open_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT COUNT(*) FROM sender_outbox WHERE state IN ('PENDING','SENDING')")
            ).scalar_one()
        )


def drive(relay: Relay, engine: Engine, timeout: float = 60.0, pause: float = 0.2) -> int:
    """Run relay passes until no row is PENDING/SENDING (or ``timeout``); returns passes run."""
    deadline = time.monotonic() + timeout
    passes = 0
    while open_count(engine) and time.monotonic() < deadline:
        relay.run_pass(budget_seconds=5.0)
        passes += 1
        if open_count(engine):
            time.sleep(pause)
    return passes


def rows(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        out = {
            r.operation_id: r
            for r in conn.execute(text("SELECT * FROM sender_outbox ORDER BY operation_id"))
        }
        jobs = {
            r.operation_id: r
            for r in conn.execute(text("SELECT * FROM sender_jobs ORDER BY operation_id"))
        }
    return {op: (r, jobs.get(op)) for op, r in out.items()}


def platform_tasks(platform: Engine, ns: str, key: str) -> list[Any]:
    with platform.connect() as conn:
        return list(
            conn.execute(
                select(tasks.c.id, tasks.c.request_json, tasks.c.queue_id).where(
                    tasks.c.namespace_id == bytes.fromhex(ns), tasks.c.idempotency_key == key
                )
            )
        )


def platform_task_count(platform: Engine, keys: list[str]) -> dict[str, int]:
    with platform.connect() as conn:
        got = conn.execute(
            select(tasks.c.idempotency_key, func.count())
            .where(tasks.c.idempotency_key.in_(keys))
            .group_by(tasks.c.idempotency_key)
        )
        return {k: int(n) for k, n in got}


def platform_receipts(platform: Engine, ns: str) -> dict[str, tuple[str, str]]:
    """idempotency key -> (task id hex, original receipt text) of namespace ``ns``."""
    with platform.connect() as conn:
        got = conn.execute(
            select(
                idempotency_records.c.idempotency_key,
                idempotency_records.c.task_id,
                idempotency_records.c.receipt_json,
            ).where(idempotency_records.c.namespace_id == bytes.fromhex(ns))
        )
        return {k: (bytes(t).hex(), r) for k, t, r in got}


def check_invariants(
    business_engine: Engine, platform: Engine, *, require_accepted: bool = False
) -> dict[str, int]:
    """SPEC §10 for the outbox; returns the count of rows per final state."""
    table = rows(business_engine)
    keys = [r.idempotency_key for r, _ in table.values()]
    counts = platform_task_count(platform, keys)
    receipts: dict[str, dict[str, tuple[str, str]]] = {}
    states: dict[str, int] = {}
    for op, (r, job) in table.items():
        states[r.state] = states.get(r.state, 0) + 1
        assert r.state in ("ACCEPTED", "REVIEW"), (op, r.state, r.last_code)
        assert r.idempotency_key == "op-" + op
        assert counts.get(r.idempotency_key, 0) <= 1, (op, counts.get(r.idempotency_key))
        assert job is not None
        if require_accepted:
            assert r.state == "ACCEPTED", (op, r.state, r.last_code)
        if r.state == "ACCEPTED":
            ns_receipts = receipts.setdefault(
                r.namespace_id, platform_receipts(platform, r.namespace_id)
            )
            task_id, receipt = ns_receipts[r.idempotency_key]
            assert r.task_id == task_id and job.task_id == task_id
            assert r.receipt_json == receipt  # the platform's original receipt, byte-exact
            assert r.last_code == "ACCEPTED" and r.wake_at is None
            (task,) = platform_tasks(platform, r.namespace_id, r.idempotency_key)
            assert task.request_json == r.request_json  # the frozen body, byte-exact
            assert bytes(task.queue_id).hex() == r.queue_id
        else:
            assert job.task_id is None and r.task_id is None and r.receipt_json is None
    return states


class ShiftedClock:
    """The database clock moved by ``seconds`` (a sender that believes it is later)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def now(self, conn: Any) -> dt.datetime:
        return db_now(conn) + dt.timedelta(seconds=self.seconds)

    def sql(self, seconds: int = 0) -> Any:
        return DB_CLOCK.sql(round(self.seconds) + seconds)


def shift_clock(seconds: float) -> Clock:
    return ShiftedClock(seconds)


def celery_env(
    business_url: str, platform_url: str, api_url: str, token: str, **extra: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(
        ORBIT_DATABASE_URL=platform_url,
        ORBIT_SENDER_DATABASE_URL=business_url,
        CELERY_BROKER_URL=REDIS_URL,
        ORBIT_API_URL=api_url,
        ORBIT_API_TOKEN=token,
        # HTTP bound: the default the lease allows (1.5 s; orbit_tasks/sender_limits.py).
        ORBIT_SENDER_LEASE_SECONDS="8",
        ORBIT_SENDER_CONCURRENCY="8",
        ORBIT_SENDER_TICK_SECONDS="1",
    )
    env.update(extra)
    return env


@contextmanager
def captured_sql(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    """Every statement (driver SQL and parameters) the engine executes inside the block."""
    seen: list[tuple[str, Any]] = []

    def before(_c: Any, _cur: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


def explain(engine: Engine, statement: str, parameters: Any) -> list[dict[str, Any]]:
    """MariaDB's plan of one captured statement, with the parameters it ran with."""
    with engine.connect() as conn:
        plan = conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
        conn.rollback()
    return [dict(row) for row in plan]
