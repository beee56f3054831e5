"""The sender's HTTP exchange is bounded in total, not only per read: a real server that
trickles its answer one byte at a time must end as TIMEOUT well before the lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orbit_tasks.sender.client import PlatformClient


class _Trickle(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"task_id":"' + b"a" * 200 + b'"}'
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for i in range(len(body)):  # one byte every 0.2 s: each read is fast, the whole is not
            try:
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.2)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def trickle_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_trickled_answer_is_a_timeout_within_the_total_bound(trickle_url: str) -> None:
    with PlatformClient(trickle_url, "orb_test", timeout_seconds=1.0) as client:
        started = time.monotonic()
        result = client.submit("a" * 32, "b" * 32, "op-" + "c" * 32, b"{}")
        elapsed = time.monotonic() - started
    assert result.transport == "timeout" and result.status is None
    # The trickle would take ~40 s; the bound is the total timeout plus one read timeout.
    assert elapsed < 10.0  # generous for a loaded machine; without the bound it takes ~40 s
