"""The fleet page's numbers (issue 29 item 1): the exporter's own snapshot (docs/metrics.md) --
jobs per storage and state, FAILED jobs by code, expired leases, workers consuming each
storage's queue and its depth, the unserved flag, the plans' backlogs and the dead letters by
code -- read by the same sources as ``orbit metrics serve``, cached as long as it caches
(``ORBIT_METRICS_CACHE_SECONDS``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine

from orbit_tasks.metrics.families import Snapshot, unserved
from orbit_tasks.settings import Settings


class FleetReader:
    """One exporter collector, built on first use (the broker and the business database may
    be down: their part of the page then says unknown)."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._collector: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, platform: Engine) -> FleetReader:
        def build() -> Any:
            # Imported here: the Celery app and the exporter's server (kombu, prometheus_client)
            # only when the fleet page is first read, not for the sign-in page or the tests'
            # own readers.
            from orbit_tasks.celery_app import app
            from orbit_tasks.metrics.server import build_collector

            return build_collector(settings, app)

        return cls(build)

    def read(self) -> Snapshot:
        with self._lock:
            if self._collector is None:
                self._collector = self._build()
        snap: Snapshot = self._collector.snapshot()
        return snap

    def review_counts(self) -> Mapping[str, int]:
        business = self.read().business
        return {} if business is None else business.review

    @staticmethod
    def unserved(snap: Snapshot) -> Mapping[bytes, int] | None:
        if snap.platform is None or snap.broker is None:
            return None
        return unserved(snap.platform, snap.broker)
