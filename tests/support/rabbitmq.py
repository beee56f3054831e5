"""The real RabbitMQ of the tests (127.0.0.1:5672, guest/guest; scripts/ensure-services.sh starts
it): one virtual host per test, created with ``rabbitmqctl`` and deleted after it, so that tests
running in parallel never share a queue (issue 30 item 2)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.support.db import XDIST_WORKER

RABBITMQ_SERVER = os.environ.get("ORBIT_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")


def rabbitmqctl(*args: str) -> str:
    proc = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"rabbitmqctl {args} -> {proc.returncode}: {proc.stderr}")
    return proc.stdout


def rabbitmq_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """A fresh virtual host on the test RabbitMQ (guest may use it); yields its broker URL."""
    name = f"orbit-test-{XDIST_WORKER}{secrets.token_hex(5)}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield f"{RABBITMQ_SERVER}/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)


def queues_of(vhost_url: str) -> dict[str, dict[str, str]]:
    """The queues of the virtual host in ``vhost_url``: name -> type, durable, arguments."""
    vhost = vhost_url.rsplit("/", 1)[1]
    out = rabbitmqctl(
        "list_queues", "-p", vhost, "--no-table-headers", "name", "type", "durable", "arguments"
    )
    found: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) >= 4:
            found[parts[0]] = {"type": parts[1], "durable": parts[2], "arguments": parts[3]}
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateNode:
    """A RabbitMQ node of one test (its own node name, ports and data folder): stopping and
    starting it disturbs no other test. Its queues and messages survive a restart (the data
    folder is kept)."""

    def __init__(self) -> None:
        # the node runs as the rabbitmq user (Debian's wrapper switches to it): a folder of its
        # own, outside pytest's private tmp folders
        folder = Path(tempfile.mkdtemp(prefix="orbit-test-rabbit-"))
        self.folder = folder
        self.port = _free_port()
        self.name = f"orbit-test-{os.getpid()}-{self.port}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        dist = _free_port()
        self.env = {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(dist),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(folder / "node.pid"),
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(folder / "advanced.config"),
        }
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "enabled_plugins").write_text("[].\n")
        # guest may connect from 127.0.0.1 (loopback_users keeps it to loopback)
        (folder / "rabbitmq.conf").write_text("loopback_users.guest = true\n")
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(folder)], check=True)

    def _ctl(self, *args: str, timeout: float = 120) -> None:
        proc = subprocess.run(
            ["rabbitmqctl", "-n", self.name, *args],
            env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(f"rabbitmqctl {args} -> {proc.returncode}: {proc.stderr}")

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def start(self) -> None:
        subprocess.run(
            ["rabbitmq-server", "-detached"], env=self.env, check=True, timeout=60,
            capture_output=True,
        )  # fmt: skip
        self._ctl("wait", str(self.folder / "node.pid"), "--timeout", "120")
        deadline = time.monotonic() + 60
        while not self.answers():
            if time.monotonic() > deadline:
                raise AssertionError(f"private RabbitMQ {self.name} does not answer")
            time.sleep(0.2)

    def stop(self) -> None:
        self._ctl("stop", str(self.folder / "node.pid"))


@contextmanager
def private_rabbitmq() -> Iterator[PrivateNode]:
    node = PrivateNode()
    try:
        node.start()
        yield node
    finally:
        with suppress(Exception):
            node.stop()
        shutil.rmtree(node.folder, ignore_errors=True)
