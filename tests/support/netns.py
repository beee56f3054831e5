"""Test hosts in network namespaces of their own, and servers they can reach (issue 14).

Each :class:`Host` is a network namespace joined to the root namespace by a veth pair on a /30
of 10.213.0.0/16 (addresses of this test's own hosts only; nothing is routed beyond the pair).
``cut()`` drops every packet of the host (iptables DROP, in and out: a blackhole, no RST, as a
partitioned network or a pulled cable), ``heal()`` removes the rules.

The machine's MariaDB and Redis listen on 127.0.0.1 only, which a namespace cannot reach, so the
tests start a private ``mariadbd`` (no grant tables: a throw-away server) and ``redis-server``
listening on every address, on free ports, stopped by the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.support.mariadb_server import PrivateMariaDB, free_port, wait_port

__all__ = ["Host", "PrivateRedis", "free_port", "hosts", "private_mariadb", "private_redis"]
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def require_tools() -> None:
    """These tests need root, ``ip`` and ``iptables`` (scripts/bootstrap.sh installs iptables)."""
    assert os.geteuid() == 0, "network namespace tests need root"
    for tool in ("ip", "iptables"):
        assert shutil.which(tool), f"{tool} is missing (run scripts/bootstrap.sh)"


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


@dataclass
class Host:
    name: str
    host_ip: str  # the root namespace's end of the pair: where the host reaches the servers
    ip: str

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        for chain in ("INPUT", "OUTPUT"):
            _run(*self.prefix, "iptables", "-A", chain, "!", "-i" if chain == "INPUT" else "-o",
                 "lo", "-j", "DROP")  # fmt: skip

    def heal(self) -> None:
        _run(*self.prefix, "iptables", "-F")


@contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """``count`` namespaces, removed afterwards (with every process still in them killed)."""
    tag = f"{os.getpid() % 10000:04d}"
    made: list[Host] = []
    try:
        for i in range(count):
            base = 4 * (int(tag) % 60 * 4 + i)
            third, fourth = divmod(base, 256)
            name, veth = f"orbit{tag}{i}", f"orb{tag}{i}"
            host_ip, ip = f"10.213.{third}.{fourth + 1}", f"10.213.{third}.{fourth + 2}"
            _run("ip", "netns", "add", name)
            made.append(Host(name, host_ip, ip))
            _run("ip", "link", "add", f"{veth}h", "type", "veth", "peer", "name", f"{veth}n")
            _run("ip", "link", "set", f"{veth}n", "netns", name)
            _run("ip", "addr", "add", f"{host_ip}/30", "dev", f"{veth}h")
            _run("ip", "link", "set", f"{veth}h", "up")
            _run("ip", "netns", "exec", name, "ip", "addr", "add", f"{ip}/30", "dev", f"{veth}n")
            _run("ip", "netns", "exec", name, "ip", "link", "set", f"{veth}n", "up")
            _run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield made
    finally:
        for h in made:
            with suppress(Exception):
                pids = subprocess.run(
                    ["ip", "netns", "pids", h.name], capture_output=True, text=True, timeout=10
                ).stdout.split()
                for pid in pids:
                    with suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
            with suppress(Exception):
                _run("ip", "netns", "del", h.name)
            with suppress(Exception):
                _run("ip", "link", "del", f"orb{h.name[5:]}h")


@contextmanager
def private_mariadb() -> Iterator[int]:
    """A throw-away MariaDB on every address (no grant tables); yields its port."""
    server = PrivateMariaDB(bind="0.0.0.0")
    try:
        server.start()
        yield server.port
    finally:
        server.remove()


class PrivateRedis:
    """A throw-away Redis on every address, on a port of its own; ``restart()`` stops it and
    starts it again on the same port, empty (as a restarted cache server without persistence)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="orbit-test-redis-"))
        self.log = self.workdir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "0.0.0.0",
                 "--protected-mode", "no", "--save", "", "--appendonly", "no",
                 "--dir", str(self.workdir)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_port(self.port, self.proc, "redis-server", self.log)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


@contextmanager
def private_redis_server() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


@contextmanager
def private_redis() -> Iterator[int]:
    """A throw-away Redis on every address; yields its port."""
    with private_redis_server() as server:
        yield server.port
