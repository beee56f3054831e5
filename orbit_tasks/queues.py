"""The Celery queue names of the fleet (SPEC §7): one place for every module that routes, consumes
or measures them."""

CONTROL_QUEUE = "orbit.control"  # archive ticks (and the default queue)
SENDER_QUEUE = "orbit.sender"  # the outbox relay and its tick
ARCHIVE_QUEUE_PREFIX = "orbit.archive."  # + storage hex: one queue per storage volume
