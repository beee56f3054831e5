"""The operator console for tests (issue 29): ``orbit console serve`` as a real subprocess on a
free port, people made with ``orbit console user add``, and an HTTP client that signs in the
way a browser does (the sign-in form's token, then the session cookie and the CSRF token of
each page's forms)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.api_server import free_port

REPO = Path(__file__).resolve().parents[2]
ORBIT = str(REPO / ".venv" / "bin" / "orbit")
STARTUP_SECONDS = 30.0
PASSWORDS = {"viewer": "viewer-secret-123", "operator": "operator-secret-456"}
CSRF = re.compile(r'name="csrf" value="([0-9a-zA-Z_\-]+)"')


@dataclass
class Console:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def orbit(env: Mapping[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ORBIT, *args], cwd=REPO, env=dict(env), input=stdin, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def add_people(env: Mapping[str, str]) -> None:
    """``viewer`` (role viewer) and ``operator`` (role operator), passwords in PASSWORDS."""
    for name, secret in PASSWORDS.items():
        proc = orbit(env, "console", "user", "add", name, "--role", name, stdin=secret + "\n")
        assert proc.returncode == 0, proc.stderr


@contextmanager
def running_console(env: Mapping[str, str], *, host: str = "127.0.0.1") -> Iterator[Console]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="orbit-console-") as tmp:
        log_path = Path(tmp) / "console.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [ORBIT, "console", "serve", "--host", host, "--port", str(port)],
                cwd=REPO, env={**os.environ, **env}, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        console = Console(f"http://127.0.0.1:{port}", proc, log_path)
        try:
            _wait_healthy(console)
            yield console
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def _wait_healthy(console: Console) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        if console.process.poll() is not None:
            raise RuntimeError(f"orbit console serve exited:\n{console.output()}")
        try:
            if httpx.get(console.base_url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"orbit console serve did not answer:\n{console.output()}")
        time.sleep(0.1)


def csrf_of(page: str) -> str:
    found = CSRF.search(page)
    assert found, page[:2000]
    return found.group(1)


def sign_in(base_url: str, name: str, password: str | None = None) -> httpx.Client:
    """A client signed in as ``name`` (its cookie jar holds the session)."""
    client = httpx.Client(base_url=base_url, timeout=30.0, follow_redirects=False)
    token = csrf_of(client.get("/login").text)
    answer = client.post(
        "/login",
        data={"csrf": token, "name": name, "password": password or PASSWORDS[name]},
    )
    assert answer.status_code == 303, answer.text[:2000]
    return client
