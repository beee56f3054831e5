"""Wake-up messages for archive jobs (SPEC §7).

A message only wakes a worker that mounts the job's storage; ownership is decided by the lease
columns in the database, so duplicate, lost or expired messages are harmless (the next tick's
sweep publishes again). Tasks are sent by name, so this module does not import ``tasks.py``.
No ETA/countdown: the database holds time.
"""

from __future__ import annotations

from typing import Any, Protocol

from orbit_tasks.queues import CONTROL_QUEUE, queue_name

RUN_JOB_TASK = "orbit.archive.run_job"
TICK_TASK = "orbit.archive.tick"
INDEX_JOB_TASK = "orbit.archive.index_job"  # issue 28: build a SUCCEEDED job's id index
SCRUB_TASK = "orbit.archive.scrub"  # issue 28: re-verify a storage's due jobs, on its queue


class Publisher(Protocol):
    """Sends one wake-up for a job; ``kind`` only labels the message (Flower), never routes it."""

    def __call__(
        self, storage_id: bytes, namespace_id: bytes, job_id: bytes, *, kind: str = ""
    ) -> None: ...


def wakeup_label(storage_id: bytes, namespace_id: bytes, job_id: bytes, kind: str = "") -> str:
    """What Flower shows instead of the raw arguments: ids and the history kind, never content."""
    parts = [f"kind={kind}"] if kind else []
    parts += [
        f"namespace={namespace_id.hex()}",
        f"storage={storage_id.hex()}",
        f"job={job_id.hex()}",
    ]
    return "(" + ", ".join(parts) + ")"


def make_publisher(app: Any) -> Publisher:
    """A publisher bound to the Celery ``app`` (tests use an app on their own broker). The
    filesystem broker's folders are created by ``celeryconfig`` when the app is configured."""

    def publish(storage_id: bytes, namespace_id: bytes, job_id: bytes, *, kind: str = "") -> None:
        app.send_task(
            RUN_JOB_TASK,
            args=[namespace_id.hex(), job_id.hex()],
            queue=queue_name(storage_id),
            argsrepr=wakeup_label(storage_id, namespace_id, job_id, kind),
        )

    return publish


def make_index_publisher(app: Any) -> Publisher:
    """Like :func:`make_publisher`, for ``orbit.archive.index_job`` (issue 28 item 1): the
    index of a SUCCEEDED job is built on a node that serves its storage."""

    def publish(storage_id: bytes, namespace_id: bytes, job_id: bytes, *, kind: str = "") -> None:
        app.send_task(
            INDEX_JOB_TASK,
            args=[namespace_id.hex(), job_id.hex()],
            queue=queue_name(storage_id),
            argsrepr=wakeup_label(storage_id, namespace_id, job_id, kind),
        )

    return publish


def publish_index_wakeup(
    storage_id: bytes, namespace_id: bytes, job_id: bytes, *, kind: str = ""
) -> None:
    """Send one ``orbit.archive.index_job`` through the deployment's broker."""
    # Imported here: the Celery app (~0.12 s) only when a wake-up is really sent.
    from orbit_tasks.celery_app import app

    make_index_publisher(app)(storage_id, namespace_id, job_id, kind=kind)


def publish_wakeup(
    storage_id: bytes, namespace_id: bytes, job_id: bytes, *, kind: str = ""
) -> None:
    """Send one ``orbit.archive.run_job`` wake-up through the deployment's broker."""
    # Imported here: the Celery app (~0.12 s) only when a wake-up is really sent; tests and
    # `orbit archive tick` callers may pass their own publisher.
    from orbit_tasks.celery_app import app

    make_publisher(app)(storage_id, namespace_id, job_id, kind=kind)


def publish_tick(expires_seconds: float, app: Any = None) -> None:
    """Wake the tick now (``orbit plan run``): one ``orbit.archive.tick`` on the control queue,
    like beat's, with ``expires`` (a tick that waited longer is stale: beat's next one comes).
    ``app``: the Celery app to send with (tests); default the deployment's."""
    sender = app
    if sender is None:
        # Imported here: the Celery app (~0.12 s) only when a wake-up is really sent.
        from orbit_tasks.celery_app import app as sender
    sender.send_task(TICK_TASK, queue=CONTROL_QUEUE, expires=max(1.0, float(expires_seconds)))


class ScrubPublisher(Protocol):
    """Sends one scrub wake-up for a storage (issue 28 item 3), to that storage's queue."""

    def __call__(self, storage_id: bytes) -> None: ...


def make_scrub_publisher(app: Any) -> ScrubPublisher:
    """A scrub publisher bound to the Celery ``app`` (tests use an app on their own broker)."""

    def publish(storage_id: bytes) -> None:
        app.send_task(
            SCRUB_TASK,
            args=[storage_id.hex()],
            queue=queue_name(storage_id),
            argsrepr=f"(storage={storage_id.hex()})",
        )

    return publish


def publish_scrub(storage_id: bytes) -> None:
    """Send one ``orbit.archive.scrub`` wake-up through the deployment's broker."""
    # Imported here: the Celery app (~0.12 s) only when a wake-up is really sent.
    from orbit_tasks.celery_app import app

    make_scrub_publisher(app)(storage_id)
