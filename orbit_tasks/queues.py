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
