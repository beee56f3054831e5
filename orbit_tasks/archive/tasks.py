"""Celery tasks of the archive (SPEC §7). Thin: the work is in tick.py and runner.py.

Messages are wake-ups only; ownership is decided by the job's lease in the database, so duplicate,
late or lost messages are harmless. Time limits come from ``celeryconfig`` (hard limit strictly
below the archive lease, soft limit below that).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init

from orbit_tasks.celery_app import app
from orbit_tasks.errors import TransientError
from orbit_tasks.logs import log_action
from orbit_tasks.settings import get_settings

log = logging.getLogger("orbit.archive.tasks")

VOLUMES_ENV = "ORBIT_ARCHIVE_VOLUMES"


@worker_process_init.connect
def _warm_reader(**_: Any) -> None:
    """A pool child of an archive worker starts its first reader process at once, so its first
    claim chain does not wait for an interpreter (docs/archive-jobs.md "The reader process")."""
    if not os.environ.get(VOLUMES_ENV):
        return  # not an archive worker
    # Imported here: only an archive worker's pool child pays for the reader (~0.25 s, like the
    # runner below).
    from orbit_tasks.archive.engine import reader_process

    reader_process.warm(get_settings())


# A database or broker that is down is the tick's one WARNING line (archive.tick.failed) and an
# expected TransientError: Celery logs it at INFO, without a second line at ERROR with a traceback.
@app.task(name="orbit.archive.tick", ignore_result=True, throws=(TransientError,))
def tick() -> dict[str, Any]:
    # Imported here: every process that loads the app (Flower, beat, sender workers) imports this
    # module; the tick and SQLAlchemy cost ~0.2 s (measured, python -X importtime).
    from orbit_tasks.archive.tick import run_tick
    from orbit_tasks.db.registry import platform_engine

    report = run_tick(platform_engine(), get_settings())
    return report.to_dict()


@app.task(name="orbit.archive.run_job", acks_late=True, ignore_result=True)
def run_job(namespace_hex: str, job_hex: str) -> str:
    # Imported here: the runner costs ~0.25 s to every process that loads the app (see tick).
    from orbit_tasks.archive.engine import runner

    volumes = runner.parse_volumes(os.environ.get(VOLUMES_ENV))
    try:
        return runner.run_job(namespace_hex, job_hex, volumes, get_settings())
    except SoftTimeLimitExceeded:
        # The claim's lease expires and the job is taken over; nothing half-confirmed exists.
        log_action(log, "archive.job.time_limit", logging.WARNING, job_id=job_hex)
        return "time_limit"
