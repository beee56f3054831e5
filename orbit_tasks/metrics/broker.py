"""The broker probe: messages waiting per queue and the workers consuming each queue now.

Messages: kombu's own count of the queue (``queue_declare(passive=True).message_count``), which
on Redis sums the list and its priority sub-lists (``<queue>\\x06\\x16<n>``), on RabbitMQ is
the broker's count of ready messages (issue 30) and on the filesystem broker counts the queue's
message files; a queue that does not exist yet has 0.

Consumers (Redis): one ``active_queues`` broadcast to every worker's remote-control mailbox,
with a reply window below the time bound; a worker counts for each queue it consumes now. The
broadcast goes through the probe's own connection (socket timeouts, one try): Celery's
``app.control.inspect()`` would publish through the app's connection pool, which has no socket
timeout and retries forever, so one connection black-holed by the network kept the probe stuck
long after the broker was back.

The filesystem broker keeps a mailbox binding of every worker that ever ran, and each broadcast
leaves a message file behind for every dead one, so the exporter does not broadcast there and
reports no consumers (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from kombu import Connection, Producer
from kombu.exceptions import ChannelError
from kombu.pidbox import Mailbox

from orbit_tasks.metrics.families import BrokerReading, consumers_of, queues_for


def queue_size(conn: Connection, queue: str) -> int:
    """Messages waiting in ``queue``, read on a channel of its own: on RabbitMQ the passive
    declare of a queue that does not exist fails with 404 NOT_FOUND and the broker closes the
    channel it was sent on (py-amqp raises its own ``NotFound``, one of the connection's
    ``channel_errors``, not kombu's ``ChannelError``); the next queue needs a fresh one."""
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except (ChannelError, *conn.channel_errors):
        return 0  # never declared: nothing waits in it
    finally:
        with suppress(Exception):  # already closed by the broker
            channel.close()


class _OneTryProducer(Producer):
    """Publishes once: the probe has its own time bound and no reason to retry."""

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["retry"] = False
        return super().publish(*args, **kwargs)


class _ProbeMailbox(Mailbox):
    """Celery's remote-control mailbox, publishing on the channel it is given."""

    @contextmanager
    def producer_or_acquire(self, producer: Any = None, channel: Any = None) -> Iterator[Any]:
        yield _OneTryProducer(channel, auto_declare=False)


def control_mailbox(conf: Any) -> Mailbox:
    """The mailbox Celery's workers listen on, as ``celery.app.control.Control`` declares it."""
    return _ProbeMailbox(
        conf.control_exchange,
        type="fanout",
        accept=conf.accept_content,
        serializer=conf.task_serializer,
        queue_ttl=conf.control_queue_ttl,
        reply_queue_ttl=conf.control_queue_ttl,
        queue_expires=conf.control_queue_expires,
        queue_exclusive=conf.control_queue_exclusive,
        queue_durable=conf.control_queue_durable,
        reply_queue_expires=conf.control_queue_expires,
    )


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
            messages = {q: queue_size(conn, q) for q in queues_for(storages())}
        return BrokerReading(messages=messages, consumers=consumers)

    def active_queues(self, conn: Connection) -> dict[str, list[str]]:
        """Worker name -> the queues it consumes, from the workers that answered in time."""
        mailbox = control_mailbox(self.app.conf)(conn)
        replies = mailbox._broadcast(
            "active_queues",
            {},
            reply=True,
            timeout=self.reply_seconds,
            channel=conn.default_channel,
        )
        out: dict[str, list[str]] = {}
        for reply in replies or []:
            for worker, queues in reply.items():
                names = [q["name"] for q in queues or [] if isinstance(q, dict) and "name" in q]
                out[str(worker)] = [str(n) for n in names]
        return out
