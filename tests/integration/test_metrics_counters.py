"""The workers' counters and histograms (issue 17 item 5) after a run with real processes: two
``celery worker -Q orbit.sender`` (prefork, two children each) sending through a fault proxy that
answers 503 to the first POST of every third key, the reference API, MariaDB, Redis, and the real
exporter (``orbit metrics serve``) summing the value files of every worker process in
``PROMETHEUS_MULTIPROC_DIR``. The scraped values must be what happened: N POSTs, M accepted."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis
from celery import Celery
from sqlalchemy import Engine

from orbit_tasks.queues import SENDER_QUEUE
from tests.support import sender as sender_support
from tests.support.metrics import names, running_exporter, value
from tests.support.processes import Proc, started
from tests.support.sender import (
    REDIS_URL,
    World,
    celery_env,
    check_invariants,
    enqueue_many,
    open_count,
)
from tests.support.sender_proxy import PASS, Fault, fault_proxy
from tests.tools.test_grafana_dashboard import metric_names, queries

pytestmark = [pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CELERY = str(REPO / ".venv" / "bin" / "celery")
ROWS = 30

world = sender_support.world
business = sender_support.business


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()


@contextmanager
def _worker(name: str, env: dict[str, str], tmp: Path) -> Iterator[Proc]:
    args = [CELERY, "-A", "orbit_tasks.celery_app", "worker", "-Q", SENDER_QUEUE, "-c", "2",
            "-P", "prefork", "--without-heartbeat", "--without-gossip", "--without-mingle",
            "-l", "INFO", "-n", f"{name}-{os.getpid()}@%h"]  # fmt: skip
    with started(args, env, tmp / f"{name}.log") as proc:
        yield proc


def test_counters_match_what_the_workers_did(
    world: World, business: tuple[str, Engine], broker: redis.Redis, tmp_path: Path
) -> None:
    url, engine = business
    counters_dir = tmp_path / "counters"  # created by the first process that counts

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method == "POST" and attempt == 1 and key is not None and int(key[-2:], 16) % 3 == 0:
            return Fault("status", status=503)
        return PASS

    ops = enqueue_many(engine, world.ns, world.queues, ROWS)
    throttled = sum(1 for op in ops if int(op[-2:], 16) % 3 == 0)
    with fault_proxy(world.api.base_url, rule) as proxy:
        env = celery_env(url, world.platform_url, proxy.url, world.token,
                         PROMETHEUS_MULTIPROC_DIR=str(counters_dir))  # fmt: skip
        app = Celery("counters-test-beat", broker=REDIS_URL)
        with ExitStack() as stack:
            stack.callback(app.close)
            stack.enter_context(_worker("count-a", env, tmp_path))
            stack.enter_context(_worker("count-b", env, tmp_path))
            end = time.monotonic() + 120
            while open_count(engine) and time.monotonic() < end:
                app.send_task("orbit.sender.tick", queue=SENDER_QUEUE, expires=5)
                time.sleep(0.5)
            assert open_count(engine) == 0, "rows still PENDING/SENDING"
            proxy.settle()
            posts = len(proxy.posts())
    assert check_invariants(engine, world.platform, require_accepted=True) == {"ACCEPTED": ROWS}
    assert posts == ROWS + throttled  # one 503 and one retry for each third key
    assert len(list(counters_dir.glob("*.db"))) >= 2  # several processes wrote values

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(
        ORBIT_DATABASE_URL=world.platform_url,
        ORBIT_SENDER_DATABASE_URL=url,
        CELERY_BROKER_URL=REDIS_URL,
        ORBIT_METRICS_CACHE_SECONDS="0",
        PROMETHEUS_MULTIPROC_DIR=str(counters_dir),
    )
    with running_exporter(env, tmp_path) as exporter:
        s = exporter.scrape()
    assert value(s, "orbit_sender_sends_total", outcome="ACCEPTED") == ROWS
    assert value(s, "orbit_sender_sends_total", outcome="UNAVAILABLE") == throttled
    sends = sum(v for (n, _labels), v in s.items() if n == "orbit_sender_sends_total")
    assert sends == posts  # every POST counted once, by its outcome
    assert value(s, "orbit_sender_http_seconds_count") == posts
    assert value(s, "orbit_sender_http_seconds_bucket", le="+Inf") == posts
    assert 0 < value(s, "orbit_sender_http_seconds_sum") < posts * 2  # type: ignore[operator]
    assert value(s, "orbit_sender_accept_lag_seconds_count") == ROWS
    assert value(s, "orbit_sender_accept_lag_seconds_sum") > 0  # type: ignore[operator]
    assert value(s, "orbit_outbox_rows", state="ACCEPTED") == ROWS
    # The dashboard's outbox queries name samples this real scrape carries.
    sender_queries = [e for _t, e in queries() if "orbit_sender_" in e or "orbit_outbox_" in e]
    assert sender_queries
    for expr in sender_queries:
        assert metric_names(expr) <= names(s), expr
