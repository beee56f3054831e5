"""``orbit metrics serve``: build the exporter from the settings and serve ``/metrics``.

The registry holds only the orbit collector (plus the exporter's own process metrics); every
scrape reads through the collector's cache (docs/metrics.md).
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

from orbit_tasks import counters
from orbit_tasks.db.schema_check import require_schema
from orbit_tasks.errors import OrbitError
from orbit_tasks.logs import log_action
from orbit_tasks.metrics.broker import BrokerSource
from orbit_tasks.metrics.collector import OrbitCollector
from orbit_tasks.metrics.sources import BusinessSource, PlatformSource, bounded_engine
from orbit_tasks.settings import Settings

log = logging.getLogger("orbit.metrics.server")


def reply_window(timeout: float) -> float:
    """How long the consumer broadcast waits for worker replies: most of the broker's time
    bound, at most 2 s (an idle prefork worker answers within milliseconds)."""
    return min(2.0, 0.4 * timeout)


def check_schema(platform: PlatformSource, business: BusinessSource | None) -> None:
    """Refuse a database that is reachable but lacks a table or has a different one (SPEC §12,
    the same start check as workers, beat and the API). An unreachable database is not refused:
    the exporter starts and reports it with ``orbit_up`` 0 (logged as ``db.schema.unchecked``)."""
    require_schema(platform.engine, "platform", allow_unreachable=True)
    if business is not None:
        require_schema(business.engine, "business", allow_unreachable=True)


def build_collector(settings: Settings, app: Any) -> OrbitCollector:
    timeout = settings.metrics_timeout_seconds
    platform = PlatformSource(
        bounded_engine(settings.database_url, timeout),
        tick_seconds=settings.tick_seconds,
        pause_alert_after_seconds=settings.archive_pause_alert_after_seconds,
    )
    business = None
    if settings.sender_database_configured:
        business = BusinessSource(bounded_engine(settings.sender_database_url, timeout))
    broker = BrokerSource(app, timeout=timeout, reply_seconds=reply_window(timeout))
    check_schema(platform, business)
    return OrbitCollector(
        platform,
        business,
        broker,
        cache_seconds=settings.metrics_cache_seconds,
        timeout=timeout,
    )


@dataclass
class RunningServer:
    server: Any
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start(collector: OrbitCollector, host: str, port: int) -> RunningServer:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    registry.register(ProcessCollector(registry=None))
    # The workers' counters and histograms (orbit_tasks/counters.py): summed over the value
    # files every worker process writes to PROMETHEUS_MULTIPROC_DIR.
    path = counters.multiprocess_dir()
    if path is not None:
        MultiProcessCollector(registry, path=path)
    log_action(log, "metrics.worker_counters", directory=path, exported=path is not None)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise OrbitError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return RunningServer(server, thread)


def serve_until_signal(running: RunningServer) -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    running.stop()
