"""Run the reference platform API as a real subprocess for tests.

``api_server(platform_url)`` starts ``.venv/bin/orbit api serve`` on a free port with
``ORBIT_DATABASE_URL`` set, waits for ``/healthz``, yields the base URL and kills the server on
exit (always, even when the test fails). ``running_api_server`` yields an :class:`ApiServer`
that also gives access to the server's combined stdout/stderr. ``tcp_forwarder`` puts a real TCP
hop in front of the database so that a test can take it away from a running API.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / ".venv" / "bin" / "orbit"
STARTUP_SECONDS = 30.0


@dataclass
class ApiServer:
    base_url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def output(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextmanager
def running_api_server(
    platform_url: str,
    port: int | None = None,
    *,
    log_level: str = "info",
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[ApiServer]:
    port = free_port() if port is None else port
    env = dict(os.environ)
    env["ORBIT_DATABASE_URL"] = platform_url
    with tempfile.TemporaryDirectory(prefix="orbit-api-") as tmp:
        env.setdefault("ORBIT_VAR_DIR", str(Path(tmp) / "var"))
        env.update(extra_env or {})
        log_path = Path(tmp) / "server.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [
                    str(ORBIT),
                    "api",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    log_level,
                ],
                cwd=REPO,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = ApiServer(f"http://127.0.0.1:{port}", port, proc, log_path)
        try:
            _wait_healthy(server)
            yield server
        finally:
            _stop(proc)


def _wait_healthy(server: ApiServer) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"orbit api serve exited with {server.process.returncode}:\n{server.output()}"
            )
        try:
            if httpx.get(server.base_url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"orbit api serve did not become healthy:\n{server.output()}")
        time.sleep(0.1)


@contextmanager
def api_server(platform_url: str, port: int | None = None) -> Iterator[str]:
    """Start the API on ``platform_url`` (a migrated platform database); yield its base URL."""
    with running_api_server(platform_url, port) as server:
        yield server.base_url


class TcpForwarder:
    """A real TCP hop in front of a server (e.g. MariaDB) that a test can cut and restore:
    ``down()`` closes the listening socket and every forwarded connection (clients then get
    "connection refused"), ``up()`` listens again on the same port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []

    def up(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            with suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in conns:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


@contextmanager
def tcp_forwarder(target_host: str, target_port: int) -> Iterator[TcpForwarder]:
    fwd = TcpForwarder(target_host, target_port)
    fwd.up()
    try:
        yield fwd
    finally:
        fwd.down()
