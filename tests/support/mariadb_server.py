"""Throw-away ``mariadbd`` servers of a test: their own datadir under /tmp, their own free port and
socket, no grant tables, started and removed by the test (network-namespace tests, the replica
tests). Needs root (``--user=root``) and the ``mariadb-server`` package's ``mariadbd`` and
``mariadb-install-db`` (scripts/bootstrap.sh).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine, create_engine

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{what} did not start: {log.read_text()}") from None
            time.sleep(0.2)


class PrivateMariaDB:
    """One private server. ``extra``: more ``mariadbd`` options (``--server-id=2``,
    ``--log-bin=...``); without ``--log-bin`` in them the server writes no binary log."""

    def __init__(self, *, bind: str = "127.0.0.1", extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.bind = bind
        self.extra = extra
        self.datadir = Path(tempfile.mkdtemp(prefix="orbit-test-mariadb-"))
        self.log = self.datadir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def server_url(self) -> str:
        return f"mysql+mysqldb://root@127.0.0.1:{self.port}"

    def url(self, database: str) -> str:
        return f"{self.server_url}/{database}"

    def admin(self) -> Engine:
        """An autocommit engine on the server (no database)."""
        return create_engine(self.server_url + "/?charset=utf8mb4", isolation_level="AUTOCOMMIT")

    def start(self) -> None:
        if not (self.datadir / "mysql").exists():
            subprocess.run(
                [INSTALL_DB, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
                 "--auth-root-authentication-method=normal", "--skip-test-db"],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
        binlog = [] if any(o.startswith("--log-bin") for o in self.extra) else ["--skip-log-bin"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [MARIADBD, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
                 f"--port={self.port}", f"--bind-address={self.bind}",
                 f"--socket={self.datadir / 'sock'}", f"--pid-file={self.datadir / 'pid'}",
                 "--skip-grant-tables", "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                 "--innodb-log-file-size=16M", *binlog, *self.extra],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_port(self.port, self.proc, "mariadbd", self.log)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.datadir, ignore_errors=True)
