"""The Celery app, configured from the top-level ``celeryconfig.py``.

Celery messages are wake-ups only: ownership lives in the database (leases), so duplicates and
losses are harmless. Task modules register themselves via ``include``.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.app.amqp import AMQP, Queues
from celery.signals import (
    beat_init,
    celeryd_after_setup,
    celeryd_init,
    setup_logging,
    worker_process_init,
    worker_shutting_down,
)

from orbit_tasks import shutdown
from orbit_tasks.logs import configure_from_settings, log_action
from orbit_tasks.queues import QUORUM_ARGUMENTS
from orbit_tasks.start_checks import (
    beat_chains,
    chains_of_queues,
    reads_source,
    refuse_unless_ready,
)

TASK_MODULES = ["orbit_tasks.archive.tasks", "orbit_tasks.sender.tasks"]


def _load_config_module() -> Any:
    try:
        return importlib.import_module("celeryconfig")
    except ModuleNotFoundError:
        # Installed without the repository root on sys.path: fall back to the checkout's file.
        root = Path(__file__).resolve().parent.parent
        sys.path.insert(0, str(root))
        return importlib.import_module("celeryconfig")


class QuorumQueues(Queues):
    """Celery's queue table, whose quorum queues carry the whole of :data:`QUORUM_ARGUMENTS`
    (the delivery limit too: Celery's ``task_create_missing_queue_type`` and
    ``task_default_queue_type`` set only the type). Every process that declares a queue --
    workers, beat, the tick and continuations publishing wake-ups -- declares it with the same
    arguments: RabbitMQ refuses a declare whose arguments differ (PRECONDITION_FAILED)."""

    def __setitem__(self, name: str, queue: Any) -> None:
        args = queue.queue_arguments or {}
        if args.get("x-queue-type") == "quorum":
            queue.queue_arguments = {**QUORUM_ARGUMENTS, **args}
            queue.durable = True
        super().__setitem__(name, queue)


class QuorumAMQP(AMQP):
    """The app's AMQP part with :class:`QuorumQueues` (celeryconfig turns quorum queues on for
    a RabbitMQ broker only; on Redis the table holds no queue arguments)."""

    queues_cls = QuorumQueues


app = Celery("orbit", include=TASK_MODULES, amqp=QuorumAMQP)
app.config_from_object(_load_config_module())


@worker_process_init.connect
def _fresh_connections_in_child(**_: Any) -> None:
    """A forked child must not reuse the parent's MySQL connections."""
    # Imported here: Flower and `celery -A` load this module; SQLAlchemy (~0.19 s) only in a worker.
    from orbit_tasks.db.registry import dispose_all_for_fork

    dispose_all_for_fork()


@celeryd_init.connect
def _log_configuration_before_start(
    conf: Any = None, options: dict[str, Any] | None = None, **_: Any
) -> None:
    """The worker warns (e.g. Celery's SecurityWarning when run as root) before it sets up
    logging; configure first so that those lines are in the chosen format too. Then the schema
    start check of the databases its queues use (a worker started without ``orbit worker``
    gets it too; docs/schema.md)."""
    options = options or {}
    _one_log_configuration(options.get("loglevel"))
    queues = options.get("queues") or [getattr(conf, "task_default_queue", None) or ""]
    if isinstance(queues, str):
        queues = queues.split(",")
    names = [q.strip() for q in queues]
    refuse_unless_ready(chains_of_queues(names), source=reads_source(names))


@beat_init.connect
def _beat_schema_check(**_: Any) -> None:
    """Beat started without ``orbit beat`` checks the databases the environment names."""
    refuse_unless_ready(beat_chains())


@setup_logging.connect
def _one_log_configuration(loglevel: int | str | None = None, **_: Any) -> None:
    """Workers (and their forked pool children) and beat log through the project's one handler
    (SPEC §12 "Logs"): ``ORBIT_LOG_FORMAT`` text or json, Celery's records included. Connecting
    this signal tells Celery not to configure logging itself. ``ORBIT_LOG_LEVEL``, when set,
    wins over ``-l``."""
    if isinstance(loglevel, int):
        default = logging.getLevelName(loglevel)
    else:
        default = str(loglevel or "INFO").upper()
    configure_from_settings(default)


@celeryd_after_setup.connect
def _log_worker_queues(sender: str, instance: Any, **_: Any) -> None:
    """What the banner shows, as one structured record (json mode starts celery with ``-q``)."""
    try:
        queues = sorted(instance.app.amqp.queues.consume_from)
    except AttributeError:  # pragma: no cover - older celery layouts
        queues = []
    log_action(
        logging.getLogger("orbit.celery_app"),
        "worker.started",
        hostname=sender,
        queues=queues,
        concurrency=instance.concurrency,
    )


@worker_shutting_down.connect
def _hand_work_back(sig: str = "", how: str = "", **_: Any) -> None:
    """In the worker's main process, on a warm shutdown (the first SIGTERM or SIGINT): set the
    shared flag its pool children read at their next boundary (orbit_tasks/shutdown.py) -- an
    archive claim confirms its file, releases the job and sends a continuation; a relay pass
    stops claiming and releases its unsent rows. Celery ignores a second SIGTERM (it waits for
    the tasks again): here it becomes a SIGQUIT, the cold shutdown that ends the pool children
    at once (their leases cover them, docs/operations.md "Rolling restarts")."""
    if how != "Warm":
        return
    if shutdown.begin() and sig == "SIGTERM":
        os.kill(os.getpid(), signal.SIGQUIT)
        return
    log_action(logging.getLogger("orbit.celery_app"), "worker.draining", signal=sig)
