"""Running the real exporter (``orbit metrics serve``) for tests and scraping it over HTTP.

``running_exporter(env)`` starts ``.venv/bin/orbit metrics serve`` on a free port of the HTTP
range given to these tests, waits until ``/metrics`` answers and stops it afterwards. Scrapes are
parsed with ``prometheus_client.parser`` into ``{(name, labels): value}``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / ".venv" / "bin" / "orbit"
HTTP_PORTS = range(19800, 19900)
REDIS_PORTS = range(6460, 6470)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the series of ``name`` with exactly ``labels``, else of the one series whose
    labels include them (a label the test does not name, such as the ``storage_label`` beside a
    ``storage``, does not matter); None when there is none. Two such series: the test is wrong."""
    exact = samples.get((name, tuple(sorted(labels.items()))))
    if exact is not None:
        return exact
    wanted = set(labels.items())
    found = [v for (n, lbl), v in samples.items() if n == name and wanted <= set(lbl)]
    assert len(found) <= 1, f"{name} {labels}: {len(found)} series match, name more labels"
    return found[0] if found else None


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


#: Ports are split between xdist workers (gw0, gw1, ...; up to 4): two workers walking one range
#: from its start drew the same free port, and one test scraped the other worker's exporter.
_WORKER_SLOTS = 4


def _own_part(ports: range) -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return ports
    width = max(len(ports) // _WORKER_SLOTS, 1)
    start = ports.start + (int(worker[2:]) % _WORKER_SLOTS) * width
    return range(start, min(start + width, ports.stop))


def free_port(ports: range) -> int:
    ports = _own_part(ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports.start}..{ports.stop - 1}")


@dataclass
class Exporter:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def scrape(self, timeout: float = 30.0) -> Samples:
        resp = httpx.get(self.url, timeout=timeout)
        assert resp.status_code == 200, resp.text
        return parse(resp.text)

    def timed_scrape(self, timeout: float = 30.0) -> tuple[Samples, float]:
        start = time.monotonic()
        samples = self.scrape(timeout)
        return samples, time.monotonic() - start

    def wait_for(
        self, pred: Callable[[Samples], Any], timeout: float, what: str, step: float = 0.5
    ) -> Samples:
        deadline = time.monotonic() + timeout
        while True:
            samples = self.scrape()
            if pred(samples):
                return samples
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}: {samples}")
            time.sleep(step)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def running_exporter(
    env: Mapping[str, str], tmp: Path, *, name: str = "exporter"
) -> Iterator[Exporter]:
    port = free_port(HTTP_PORTS)
    log = tmp / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [str(ORBIT), "metrics", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=dict(env),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    exporter = Exporter(f"http://127.0.0.1:{port}/metrics", proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"exporter exited {proc.returncode}: {exporter.output()}"
            with suppress(httpx.TransportError):
                if httpx.get(exporter.url, timeout=30).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"exporter not serving: {exporter.output()}"
            time.sleep(0.2)
        yield exporter
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@dataclass
class ExtraRedis:
    """A Redis server of our own (the tests may stop and kill it)."""

    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def signal(self, sig: int) -> None:
        with suppress(ProcessLookupError):
            self.proc.send_signal(sig)


@contextmanager
def extra_redis(tmp: Path) -> Iterator[ExtraRedis]:
    port = free_port(REDIS_PORTS)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    server = ExtraRedis(port, proc)
    try:
        deadline = time.monotonic() + 10
        while True:
            with suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert proc.poll() is None and time.monotonic() < deadline, "redis did not start"
            time.sleep(0.1)
        yield server
    finally:
        server.signal(signal.SIGCONT)
        server.signal(signal.SIGKILL)
        proc.wait(timeout=10)
