"""The Celery app, configured from the top-level ``celeryconfig.py``.

Celery messages are wake-ups only: ownership lives in the database (leases), so duplicates and
losses are harmless. Task modules register themselves via ``include``.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import (
    beat_init,
    celeryd_after_setup,
    celeryd_init,
    setup_logging,
    worker_process_init,
)

from orbit_tasks.logs import configure_from_settings, log_action
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


app = Celery("orbit", include=TASK_MODULES)
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
