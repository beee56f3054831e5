"""The Prometheus collector: read every source at scrape time, within a deadline, cached.

A refresh starts one thread per source and waits for all of them until ``timeout`` after its
start; a source that has not answered by then (a hung database, a stopped Redis) is reported
down (``orbit_up`` 0) and the others still come. The thread of a hung read is left to finish on
its own (its driver timeouts end it); until it has, that source is reported down without
starting a second read, so a hung server never piles up threads or connections.

Results are cached for ``cache_seconds`` (ORBIT_METRICS_CACHE_SECONDS) from the start of the
refresh: scrapes inside the window, concurrent ones included, cost no read at all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from orbit_tasks.db.faults import driver_code
from orbit_tasks.logs import log_action
from orbit_tasks.metrics.broker import BrokerSource
from orbit_tasks.metrics.families import Snapshot, build
from orbit_tasks.metrics.sources import BusinessSource, PlatformSource

log = logging.getLogger("orbit.metrics.collector")


class SourceCall:
    """One read of one source in its own daemon thread."""

    def __init__(self, name: str, fn: Callable[[], Any], clock: Callable[[], float]) -> None:
        self.name = name
        self.clock = clock
        self.started = clock()
        self.finished: float | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(fn,), name=f"orbit-metrics-{name}", daemon=True
        )
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # noqa: BLE001 - reported as the source being down
            self.error = exc
        finally:
            self.finished = self.clock()
            self.done.set()


class OrbitCollector(Collector):
    def __init__(
        self,
        platform: PlatformSource,
        business: BusinessSource | None,
        broker: BrokerSource,
        *,
        cache_seconds: float,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.platform = platform
        self.business = business
        self.broker = broker
        self.cache_seconds = cache_seconds
        self.timeout = timeout
        self.clock = clock
        self.refreshes = 0
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._taken_at = 0.0
        self._inflight: dict[str, SourceCall] = {}
        self._known_storages: tuple[bytes, ...] = ()
        self._known_names: dict[str, str] = {}

    def collect(self) -> Iterator[Metric]:
        return iter(build(self.snapshot()))

    def snapshot(self) -> Snapshot:
        """The cached snapshot, or a fresh one when the cache window has passed."""
        with self._lock:
            started = self.clock()
            if self._snapshot is not None and started - self._taken_at < self.cache_seconds:
                return self._snapshot
            self._snapshot = self._refresh(started)
            self._taken_at = started
            self.refreshes += 1
            return self._snapshot

    def _refresh(self, started: float) -> Snapshot:
        deadline = started + self.timeout
        storages_known = threading.Event()
        found: list[tuple[bytes, ...]] = []

        def on_storages(storages: tuple[bytes, ...]) -> None:
            found.append(storages)
            storages_known.set()

        def read_platform() -> Any:
            try:
                return self.platform.read(on_storages)
            finally:
                storages_known.set()  # failed early: the broker uses the last known list

        def storages_for_broker() -> tuple[bytes, ...]:
            # Wait for this refresh's list, but leave the probe time for the queue lengths.
            reserve = min(1.0, self.timeout / 5)
            storages_known.wait(max(0.0, deadline - reserve - self.clock()))
            return found[0] if found else self._known_storages

        reads: dict[str, Callable[[], Any]] = {
            "platform_db": read_platform,
            "broker": lambda: self.broker.read(storages_for_broker),
        }
        if self.business is not None:
            reads["business_db"] = self.business.read
        calls = {name: self._start(name, fn) for name, fn in reads.items()}
        if calls["platform_db"] is None:
            storages_known.set()
        values: dict[str, Any] = {}
        seconds: dict[str, float] = {}
        for name, call in calls.items():
            values[name], seconds[name] = self._outcome(name, call, deadline)
        if values["platform_db"] is not None:
            self._known_storages = values["platform_db"].storages
            self._known_names = dict(values["platform_db"].namespace_names)
        return Snapshot(
            platform=values["platform_db"],
            business=values.get("business_db"),
            broker=values["broker"],
            business_configured=self.business is not None,
            read_seconds=seconds,
            namespace_names=self._known_names,
        )

    def _start(self, name: str, fn: Callable[[], Any]) -> SourceCall | None:
        previous = self._inflight.get(name)
        if previous is not None and not previous.done.is_set():
            return None  # an earlier read still hangs; do not start another one
        call = self._inflight[name] = SourceCall(name, fn, self.clock)
        return call

    def _outcome(self, name: str, call: SourceCall | None, deadline: float) -> tuple[Any, float]:
        if call is None:
            busy = self._inflight[name]
            log_action(
                log,
                "metrics.source.down",
                logging.WARNING,
                source=name,
                reason="previous_read_still_running",
                running_seconds=round(self.clock() - busy.started, 3),
            )
            return None, self.clock() - busy.started
        call.done.wait(max(0.0, deadline - self.clock()))
        if not call.done.is_set():
            log_action(
                log, "metrics.source.down", logging.WARNING, source=name, reason="timeout",
                timeout_seconds=self.timeout,
            )  # fmt: skip
            return None, self.clock() - call.started
        took = (call.finished or self.clock()) - call.started
        if call.error is not None:
            log_action(
                log,
                "metrics.source.down",
                logging.WARNING,
                source=name,
                reason="error",
                error=type(call.error).__name__,
                code=driver_code(call.error),
            )
            return None, took
        return call.value, took
