"""Wake-up messages for archive jobs (SPEC §7).

A message only wakes a worker that mounts the job's storage; ownership is decided by the lease
columns in the database, so duplicate, lost or expired messages are harmless (the next tick's
sweep publishes again). Tasks are sent by name, so this module does not import ``tasks.py``.
No ETA/countdown: the database holds time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RUN_JOB_TASK = "orbit.archive.run_job"
QUEUE_PREFIX = "orbit.archive."

Publisher = Callable[[bytes, bytes, bytes], None]


def queue_name(storage_id: bytes) -> str:
    """``orbit.archive.<storage_hex>``: the queue consumed only by nodes mounting that volume."""
    if len(storage_id) != 16:
        raise ValueError(f"storage id must be 16 bytes, got {len(storage_id)}")
    return QUEUE_PREFIX + storage_id.hex()


def make_publisher(app: Any) -> Publisher:
    """A publisher bound to the Celery ``app`` (tests use an app on their own broker). The
    filesystem broker's folders are created by ``celeryconfig`` when the app is configured."""

    def publish(storage_id: bytes, namespace_id: bytes, job_id: bytes) -> None:
        app.send_task(
            RUN_JOB_TASK,
            args=[namespace_id.hex(), job_id.hex()],
            queue=queue_name(storage_id),
        )

    return publish


def publish_wakeup(storage_id: bytes, namespace_id: bytes, job_id: bytes) -> None:
    """Send one ``orbit.archive.run_job`` wake-up through the deployment's broker."""
    from orbit_tasks.celery_app import app

    make_publisher(app)(storage_id, namespace_id, job_id)
