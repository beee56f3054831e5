"""Celery tasks of the archive (SPEC §7). Thin: the work is in tick.py and runner.py.

Messages are wake-ups only; ownership is decided by the job's lease in the database, so duplicate,
late or lost messages are harmless. Time limits come from ``celeryconfig`` (hard limit strictly
below the archive lease, soft limit below that).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from billiard.exceptions import WorkerLostError
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_failure, worker_process_init, worker_shutdown

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
    from orbit_tasks.archive.engine import claim_marks, reader_process

    settings = get_settings()
    reader_process.warm(settings)
    claim_marks.enable(settings.var_dir)  # where the main process finds our claim if we die


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
    from orbit_tasks.archive.engine import claim_marks, runner

    volumes = runner.parse_volumes(os.environ.get(VOLUMES_ENV))
    try:
        return runner.run_job(namespace_hex, job_hex, volumes, get_settings())
    except SoftTimeLimitExceeded:
        # The claim's lease expires and the job is taken over; nothing half-confirmed exists.
        log_action(log, "archive.job.time_limit", logging.WARNING, job_id=job_hex)
        return "time_limit"
    finally:
        claim_marks.clear()


@app.task(name="orbit.archive.index_job", acks_late=True, ignore_result=True)
def index_job(namespace_hex: str, job_hex: str) -> str:
    """Build the id index of a SUCCEEDED job (issue 28 item 1), woken by the tick; a job
    indexed already, or not on this worker's storages, is left alone."""
    # Imported here: the index engine and SQLAlchemy, as for the runner above.
    from orbit_tasks.archive.engine import index, runner
    from orbit_tasks.archive.engine.storage import open_storage
    from orbit_tasks.archive.store import jobs as job_store
    from orbit_tasks.db.registry import platform_engine

    volumes = runner.parse_volumes(os.environ.get(VOLUMES_ENV))
    engine = platform_engine()
    with engine.connect() as conn:
        job = job_store.get_job(conn, bytes.fromhex(namespace_hex), bytes.fromhex(job_hex))
    if job is None or job.storage_id.hex() not in volumes:
        return "skipped"
    try:
        built = index.build_index(engine, open_storage(volumes[job.storage_id.hex()]), job)
    except index.ChainInvalid as exc:  # `orbit job verify` names the file; nothing written
        log_action(log, "archive.index.refused", logging.WARNING, job_id=job_hex, error=str(exc))
        return "refused"
    return "built" if built.written else "indexed"


#: The scrub's own time limits (issue 28): a job is verified in one go at the storage's bounded
#: read rate (1 GiB at the lowest rate, 64 KiB/s, is ~4.6 h); its lease is renewed every second
#: while it reads, so a dead worker's storage is free again after one lease.
SCRUB_TIME_LIMIT = 6 * 3600


@app.task(
    name="orbit.archive.scrub", acks_late=True, ignore_result=True,
    time_limit=SCRUB_TIME_LIMIT, soft_time_limit=SCRUB_TIME_LIMIT - 60,
)  # fmt: skip
def scrub(storage_hex: str) -> str:
    """Re-verify the due jobs of one storage this worker serves (docs/operations.md "Scrub")."""
    # Imported here: as in run_job (the verifier, the store and SQLAlchemy).
    from orbit_tasks.archive.engine import runner
    from orbit_tasks.archive.engine import scrub as scrubbing
    from orbit_tasks.archive.wakeups import publish_scrub
    from orbit_tasks.db.faults import driver_code, is_transient_db
    from orbit_tasks.db.registry import platform_engine, source_engine

    place = runner.parse_volumes(os.environ.get(VOLUMES_ENV)).get(storage_hex)
    if place is None:
        log_action(log, "archive.scrub.not_mounted", storage_id=storage_hex)
        return "not_mounted"
    settings = get_settings()
    try:
        report = scrubbing.scrub_storage(
            platform_engine(), bytes.fromhex(storage_hex), place, settings,
            publish=publish_scrub, slice_seconds=settings.archive_slice_seconds,
            source_engine=source_engine(),
        )  # fmt: skip
    except SoftTimeLimitExceeded:
        log_action(log, "archive.scrub.time_limit", logging.WARNING, storage_id=storage_hex)
        return "time_limit"
    except Exception as exc:
        if not is_transient_db(exc):
            raise
        log_action(
            log, "archive.scrub.transient", logging.WARNING, storage_id=storage_hex,
            error=type(exc).__name__, code=driver_code(exc),
        )  # fmt: skip
        return "transient"
    return report.stop.value


@task_failure.connect(sender=run_job)
def _child_lost(exception: BaseException | None = None, args: Any = None, **_: Any) -> None:
    """In the worker's main process: the pool child that ran this delivery died (SIGKILL, OOM).
    Expire the lease it marked and wake a takeover now, not after the lease
    (docs/archive-jobs.md "A dead pool child"). Best effort: the lease expires anyway."""
    if not isinstance(exception, WorkerLostError) or not os.environ.get(VOLUMES_ENV):
        return
    # Imported here: as in run_job (the store and SQLAlchemy, only when a child was lost).
    from orbit_tasks.archive.engine import claim_marks
    from orbit_tasks.db.registry import platform_engine

    try:
        ns_hex, job_hex = args
        claim_marks.take_over_lost(platform_engine(), get_settings().var_dir, ns_hex, job_hex)
    except Exception as exc:  # the database or broker is down: the lease expires by itself
        log_action(log, "archive.job.child_lost_failed", logging.WARNING, error=type(exc).__name__)


@worker_shutdown.connect
def _remove_marks(**_: Any) -> None:
    """The main process of an archive worker leaves no claim marks behind."""
    if not os.environ.get(VOLUMES_ENV):
        return
    from orbit_tasks.archive.engine import claim_marks

    claim_marks.remove_marks(get_settings().var_dir, os.getpid())
