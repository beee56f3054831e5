"""Run the reference platform API as a real subprocess for tests.

``api_server(platform_url)`` starts ``.venv/bin/orbit api serve`` on a free port with
``ORBIT_DATABASE_URL`` set, waits for ``/healthz``, yields the base URL and kills the server on
exit (always, even when the test fails). ``running_api_server`` yields an :class:`ApiServer`
that also gives access to the server's combined stdout/stderr.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
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
