"""The collector's deadline and cache logic with stand-in sources (pure logic: threads and
clocks only; the real sources are exercised in tests/integration/test_metrics_*.py)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from orbit_tasks.metrics.collector import OrbitCollector
from orbit_tasks.metrics.families import BrokerReading, BusinessReading, PlatformReading

NOW = dt.datetime(2026, 5, 1)
A = bytes(16)


class Platform:
    def __init__(self, storages: tuple[bytes, ...] = (A,)) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.release.set()
        self.fail: BaseException | None = None
        self.storages = storages

    def read(self, on_storages: Callable[[tuple[bytes, ...]], None]) -> PlatformReading:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        on_storages(self.storages)
        self.release.wait()
        return PlatformReading(NOW, self.storages, {}, {}, {}, {}, {}, {})


class Business:
    def __init__(self) -> None:
        self.calls = 0

    def read(self) -> BusinessReading:
        self.calls += 1
        return BusinessReading(NOW, {}, {}, None, 0)


class Broker:
    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[Sequence[bytes]] = []

    def read(self, storages: Callable[[], Sequence[bytes]]) -> BrokerReading:
        self.calls += 1
        self.seen.append(tuple(storages()))
        return BrokerReading({}, {})


def _collector(platform: Any, *, cache: float = 0, timeout: float = 0.6, clock: Any = None) -> Any:
    return OrbitCollector(
        platform,
        Business(),  # type: ignore[arg-type]
        Broker(),  # type: ignore[arg-type]
        cache_seconds=cache,
        timeout=timeout,
        clock=clock or time.monotonic,
    )


def test_a_hung_source_is_down_at_the_deadline_and_not_read_twice() -> None:
    platform = Platform()
    platform.release.clear()  # hangs after announcing its storages
    collector = _collector(platform)
    start = time.monotonic()
    snap = collector.snapshot()
    assert time.monotonic() - start < 0.6 + 0.3
    assert snap.platform is None and snap.business is not None and snap.broker is not None
    assert collector.broker.seen == [(A,)]  # this refresh's storages, announced before the hang
    snap = collector.snapshot()  # still hanging: reported down, no second read started
    assert snap.platform is None and platform.calls == 1
    assert snap.read_seconds["platform_db"] >= 0.6
    platform.release.set()
    deadline = time.monotonic() + 5
    while collector._inflight["platform_db"].thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    snap = collector.snapshot()
    assert snap.platform is not None and platform.calls == 2


def test_a_failing_source_is_down_the_others_still_come() -> None:
    platform = Platform()
    platform.fail = ConnectionError("refused")
    collector = _collector(platform)
    start = time.monotonic()
    snap = collector.snapshot()
    assert snap.platform is None and snap.business is not None and snap.broker is not None
    assert collector.broker.seen == [()]  # no list known yet, and no wait for one
    assert time.monotonic() - start < 0.5
    platform.fail = None
    assert collector.snapshot().platform is not None
    platform.fail = ConnectionError("refused")
    collector.snapshot()
    assert collector.broker.seen[-1] == (A,)  # the last list known


def test_snapshots_inside_the_cache_window_read_nothing() -> None:
    clock = [100.0]
    platform = Platform()
    collector = _collector(platform, cache=15, clock=lambda: clock[0])
    first = collector.snapshot()
    clock[0] = 114.99
    assert collector.snapshot() is first
    assert (platform.calls, collector.business.calls, collector.broker.calls) == (1, 1, 1)
    clock[0] = 115.0
    assert collector.snapshot() is not first
    assert (platform.calls, collector.business.calls, collector.broker.calls) == (2, 2, 2)


def test_cache_zero_reads_at_every_scrape() -> None:
    platform = Platform()
    collector = _collector(platform, cache=0)
    for _ in range(3):
        collector.snapshot()
    assert platform.calls == 3
