"""The sender's HTTP exchange is bounded in total, not only per read: a real server that
trickles its answer one byte at a time must end as TIMEOUT well before the lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orbit_tasks.sender.client import IdentityUnavailable, PlatformClient


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


class _TrickleHeaders(BaseHTTPRequestHandler):
    """Status line and headers one byte every 0.2 s (each read is quick, the whole is not)."""

    def _trickle(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        head = (
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            + b"X-Pad: "
            + (b"p" * 200)
            + b"\r\nContent-Length: 2\r\n\r\n{}"
        )
        for i in range(len(head)):
            try:
                self.wfile.write(head[i : i + 1])
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.2)

    do_POST = _trickle  # noqa: N815 - http.server naming
    do_GET = _trickle  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def trickle_headers_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TrickleHeaders)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_trickled_headers_are_a_timeout_within_the_total_bound(trickle_headers_url: str) -> None:
    """The bound covers the whole exchange (connect, send, status line, headers, body): the
    relay's pass limits (orbit_tasks/sender_limits.py) rely on it."""
    with PlatformClient(trickle_headers_url, "orb_test", timeout_seconds=1.0) as client:
        started = time.monotonic()
        result = client.submit("a" * 32, "b" * 32, "op-" + "c" * 32, b"{}")
        elapsed = time.monotonic() - started
    assert result.transport == "timeout" and result.status is None
    assert elapsed < 1.5  # the whole trickle would take ~60 s


def test_trickled_identity_is_unavailable_within_the_total_bound(
    trickle_headers_url: str,
) -> None:
    with PlatformClient(trickle_headers_url, "orb_test", timeout_seconds=1.0) as client:
        started = time.monotonic()
        with pytest.raises(IdentityUnavailable, match="timed out"):
            client.identity()
        elapsed = time.monotonic() - started
    assert elapsed < 1.5
