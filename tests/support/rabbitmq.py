"""The real RabbitMQ of the tests (127.0.0.1:5672, guest/guest; scripts/ensure-services.sh starts
it): one virtual host per test, created with ``rabbitmqctl`` and deleted after it, so that tests
running in parallel never share a queue (issue 30 item 2)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

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
