"""A private MariaDB server for benchmarks: its own datadir under /tmp, its own port, a buffer
pool chosen per measurement (a large one for "in cache", 128 MB for "out of cache"), started
and stopped by the benchmark itself. Bound to 127.0.0.1, no grant tables (a throw-away server).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"


class MariaDBInstance:
    def __init__(self, port: int) -> None:
        self.port = port
        self.datadir = Path(tempfile.mkdtemp(prefix="orbit-bench-mariadb-"))
        self.pool = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def server_url(self) -> str:
        return f"mysql+mysqldb://root@127.0.0.1:{self.port}"

    def client(self, database: str) -> list[str]:
        """The ``mariadb`` command line client, connected over TCP to this server."""
        return ["mariadb", "-h", "127.0.0.1", "-P", str(self.port), "-u", "root", database]

    def start(self, pool: str) -> None:
        if not (self.datadir / "mysql").exists():
            subprocess.run(
                [INSTALL_DB, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
                 "--auth-root-authentication-method=normal", "--skip-test-db"],
                check=True, capture_output=True,
            )  # fmt: skip
        self.pool = pool
        log = open(self.datadir / "server.log", "ab")  # noqa: SIM115 - lives with the server
        self._proc = subprocess.Popen(
            [MARIADBD, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
             f"--port={self.port}", "--bind-address=127.0.0.1",
             f"--socket={self.datadir / 'mysqld.sock'}", f"--pid-file={self.datadir / 'pid'}",
             "--skip-grant-tables", "--skip-log-bin", f"--innodb-buffer-pool-size={pool}",
             "--innodb-log-file-size=256M", "--max-connections=64"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mariadbd did not start; see {self.datadir / 'server.log'}")
            time.sleep(0.2)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
        except OSError:
            return False
        probe = subprocess.run([*self.client("mysql"), "-e", "SELECT 1"], capture_output=True)
        return probe.returncode == 0

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()  # a clean shutdown: the next start needs no crash recovery
        try:
            self._proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self, pool: str) -> None:
        """A cold buffer pool of ``pool`` bytes (O_DIRECT: the OS page cache does not help)."""
        self.stop()
        self.start(pool)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.datadir, ignore_errors=True)
