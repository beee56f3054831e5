"""The fleet page's numbers (issue 29 item 1): the exporter's own snapshot (docs/metrics.md) --
jobs per storage and state, FAILED jobs by code, expired leases, workers consuming each
storage's queue and its depth, the unserved flag, the plans' backlogs and the dead letters by
code -- read by the same sources as ``orbit metrics serve``.

A page never waits for the sources: a background thread takes a snapshot every
``ORBIT_METRICS_CACHE_SECONDS`` (at least 1 s) and the pages read the last one; only the first
page after the start waits for the first snapshot."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine

from orbit_tasks.logs import log_action
from orbit_tasks.metrics.families import Snapshot, unserved
from orbit_tasks.settings import Settings

log = logging.getLogger("orbit.console.fleet")


class FleetReader:
    """One exporter collector, built on first use (the broker and the business database may
    be down: their part of the page then says unknown), and the last snapshot it took."""

    def __init__(self, build: Callable[[], Any], every: float = 15.0) -> None:
        self._build = build
        self.every = max(1.0, every)
        self._collector: Any = None
        self._lock = threading.Lock()
        self._last: Snapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings, platform: Engine) -> FleetReader:
        def build() -> Any:
            # Imported here: the Celery app and the exporter's server (kombu, prometheus_client)
            # only when the fleet is first read, not for the sign-in page.
            from orbit_tasks.celery_app import app
            from orbit_tasks.metrics.server import build_collector

            return build_collector(settings, app)

        return cls(build, every=settings.metrics_cache_seconds)

    def _take(self) -> Snapshot:
        with self._lock:
            if self._collector is None:
                self._collector = self._build()
            snap: Snapshot = self._collector.snapshot()
            self._last = snap
            return snap

    def read(self) -> Snapshot:
        """The last snapshot (the first one is taken now)."""
        last = self._last
        return self._take() if last is None else last

    def start(self) -> None:
        """Keep the snapshot fresh in a background thread (until :meth:`stop`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="console-fleet", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._take()
            except Exception as exc:  # the page says unknown; the next round tries again
                log_action(log, "console.fleet.unavailable", logging.WARNING,
                           error=type(exc).__name__)  # fmt: skip
            self._stop.wait(self.every)

    def review_counts(self) -> Mapping[str, int]:
        business = self.read().business
        return {} if business is None else business.review

    @staticmethod
    def unserved(snap: Snapshot) -> Mapping[bytes, int] | None:
        if snap.platform is None or snap.broker is None:
            return None
        return unserved(snap.platform, snap.broker)
