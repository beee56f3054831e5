"""The broker probe: messages waiting per queue and the workers consuming each queue now.

Messages: kombu's own count of the queue (``queue_declare(passive=True).message_count``), which
on Redis sums the list and its priority sub-lists (``<queue>\\x06\\x16<n>``) and on the
filesystem broker counts the queue's message files; a queue that does not exist yet has 0.

Consumers (Redis): one ``active_queues`` broadcast to every worker's remote-control mailbox,
with a reply window below the time bound; a worker counts for each queue it consumes now. The
filesystem broker keeps a mailbox binding of every worker that ever ran, and each broadcast
leaves a message file behind for every dead one, so the exporter does not broadcast there and
reports no consumers (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kombu import Connection
from kombu.exceptions import ChannelError

from orbit_tasks.metrics.families import BrokerReading, consumers_of, queues_for


def queue_size(channel: Any, queue: str) -> int:
    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except ChannelError:
        return 0  # never declared: nothing waits in it


class BrokerSource:
    """Reads the broker of the Celery ``app`` (the deployment's CELERY_BROKER_URL)."""

    name = "broker"

    def __init__(self, app: Any, *, timeout: float, reply_seconds: float) -> None:
        self.app = app
        self.url = str(app.conf.broker_url)
        self.transport_options: Mapping[str, Any] = dict(app.conf.broker_transport_options or {})
        self.timeout = timeout
        self.reply_seconds = reply_seconds

    @property
    def observes_consumers(self) -> bool:
        return not self.url.startswith("filesystem://")

    def _connection(self) -> Connection:
        options = dict(self.transport_options)
        # Redis: a stopped or unreachable server raises instead of blocking the probe.
        options.update(
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            max_retries=1,
        )
        return Connection(self.url, connect_timeout=self.timeout, transport_options=options)

    def read(self, storages: Callable[[], Sequence[bytes]] = tuple) -> BrokerReading:
        """One probe. ``storages`` gives the registered storages (it may wait for the platform
        read, within the probe's own time)."""
        with self._connection() as conn:
            conn.ensure_connection(max_retries=1, timeout=self.timeout)
            consumers = None
            if self.observes_consumers:
                consumers = consumers_of(self.active_queues(conn))
            channel = conn.default_channel
            messages = {q: queue_size(channel, q) for q in queues_for(storages())}
        return BrokerReading(messages=messages, consumers=consumers)

    def active_queues(self, conn: Connection) -> dict[str, list[str]]:
        """Worker name -> the queues it consumes, from the workers that answered in time."""
        inspector = self.app.control.inspect(timeout=self.reply_seconds, connection=conn)
        replies = inspector.active_queues() or {}
        return {
            worker: [str(q["name"]) for q in queues or [] if isinstance(q, dict) and "name" in q]
            for worker, queues in replies.items()
        }
