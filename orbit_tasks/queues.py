"""The Celery queue names of the fleet (SPEC §7): one place for every module that routes, consumes
or measures them."""

CONTROL_QUEUE = "orbit.control"  # archive ticks (and the default queue)
SENDER_QUEUE = "orbit.sender"  # the outbox relay and its tick
ARCHIVE_QUEUE_PREFIX = "orbit.archive."  # + storage hex: one queue per storage volume


def queue_name(storage_id: bytes) -> str:
    """``orbit.archive.<storage_hex>``: the queue consumed only by nodes mounting that volume."""
    if len(storage_id) != 16:
        raise ValueError(f"storage id must be 16 bytes, got {len(storage_id)}")
    return ARCHIVE_QUEUE_PREFIX + storage_id.hex()


#: RabbitMQ (issue 30 item 2): every ``orbit.*`` queue is a durable quorum queue. A message
#: delivered this many times without an ack (a worker that died or was cut off with it, each
#: time) is dropped: messages are only wake-ups, and the next tick's sweep publishes again.
DELIVERY_LIMIT = 10
QUORUM_ARGUMENTS = {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT}
_AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


def is_amqp(broker_url: str) -> bool:
    """Whether ``broker_url`` names a RabbitMQ (AMQP 0-9-1) broker."""
    return broker_url.split("://", 1)[0].split("+", 1)[0] in _AMQP_SCHEMES
