"""A real HTTP fault proxy between the sender and the reference API (tests only).

A threaded ``http.server`` forwards every request to the upstream API over a real HTTP hop, and
applies a programmable fault per request: answer a status without forwarding, drop the connection
before or AFTER the platform committed, sleep before forwarding. Every request is recorded (time,
method, path, idempotency key, action) so that tests can check what was sent and when.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


@dataclass(frozen=True)
class Fault:
    """What to do with one request.

    kind: "pass" (forward), "status" (answer ``status`` without forwarding), "drop_before"
    (close without forwarding), "drop_after" (forward, let the platform commit, then close without
    answering), "sleep" (sleep ``seconds`` then forward; the client may have given up),
    "truncate" (forward the request without its body's last byte: a store that keeps less).
    """

    kind: str = "pass"
    status: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0
    body: bytes = b'{"error":"injected","message":"fault proxy"}'
    drop_headers: tuple[str, ...] = ()  # forwarded answers: these headers (lowercase) left out


PASS = Fault()


@dataclass
class Seen:
    at: float  # time.time()
    method: str
    path: str
    key: str | None
    attempt: int  # 1-based per idempotency key (0 for requests without a key)
    action: str
    upstream_status: int | None = None


Rule = Callable[[str, str, str | None, int], Fault]


@dataclass
class FaultProxy:
    upstream: str
    rule: Rule = field(default=lambda method, path, key, attempt: PASS)
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _attempts: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def posts(self, key: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.method == "POST" and (key is None or s.key == key)]

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until no forwarded request is still on its way to the platform."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                busy = any(
                    s.upstream_status is None
                    and s.action in ("pass", "sleep", "drop_after", "truncate")
                    for s in self.seen
                )
            if not busy:
                return
            time.sleep(0.05)
        raise TimeoutError("the fault proxy still has requests in flight")

    def _next_attempt(self, key: str | None) -> int:
        with self._lock:
            if key is None:
                return 0
            self._attempts[key] = self._attempts.get(key, 0) + 1
            return self._attempts[key]

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)


def _handler(proxy: FaultProxy, client: httpx.Client) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
            return

        def _drop(self) -> None:
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            key = self.headers.get("Idempotency-Key")
            attempt = proxy._next_attempt(key)
            fault = proxy.rule(self.command, self.path, key, attempt)
            seen = Seen(time.time(), self.command, self.path, key, attempt, fault.kind)
            proxy._record(seen)
            if fault.kind == "status":
                data = fault.body
                self.send_response(fault.status)
                for name, value in fault.headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if fault.kind == "drop_before":
                self._drop()
                return
            if fault.kind == "sleep":
                time.sleep(fault.seconds)
            if fault.kind == "truncate":
                body = body[:-1]
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in ("host", "content-length", "connection", "expect")
            }
            try:
                resp = client.request(self.command, self.path, content=body, headers=headers)
            except httpx.HTTPError:
                seen.upstream_status = -1  # the platform itself was unreachable
                self._drop()
                return
            seen.upstream_status = resp.status_code
            if fault.kind == "drop_after":
                self._drop()
                return
            try:
                self.send_response(resp.status_code)
                for name, value in resp.headers.items():
                    if name.lower() in ("content-length", "transfer-encoding", "connection"):
                        continue
                    if name.lower() in fault.drop_headers:
                        continue
                    self.send_header(name, value)
                if self.command == "HEAD":  # no body: the length is the upstream's
                    self.send_header("Content-Length", resp.headers.get("content-length", "0"))
                    self.end_headers()
                    return
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)
            except OSError:
                pass  # the client gave up (timeout): the platform committed anyway

        do_GET = _handle
        do_POST = _handle
        do_PUT = _handle  # the S3 tests put this proxy between a worker and the S3 server
        do_HEAD = _handle
        do_DELETE = _handle

    return Handler


@contextmanager
def fault_proxy(upstream: str, rule: Rule | None = None) -> Iterator[FaultProxy]:
    """Run a proxy to ``upstream`` on a free local port until the block ends."""
    proxy = FaultProxy(upstream)
    if rule is not None:
        proxy.rule = rule
    client = httpx.Client(base_url=upstream, timeout=30.0, trust_env=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy, client))
    server.daemon_threads = True
    proxy.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        client.close()
