"""The scheduled scrub (issue 28 item 3): re-verify the SUCCEEDED jobs of one storage from the
storage itself, at a bounded read rate, and record each result.

One pass (:func:`scrub_storage`) is what the ``orbit.archive.scrub`` task runs on a node that
serves the storage (its queue), and what ``orbit archive scrub`` runs in the foreground:

1. take the storage's scrub lease (``store/scrubs.py``; busy: another scrub reads it now, so the
   rate bound of the storage holds across nodes);
2. the next job due (oldest verification first), or the one job asked for;
3. the controls of the job's scope through the gate (``engine/gate.py``): a pause, a closed run
   window or the load guard end the pass before the job and while it is read (checked at least
   once a second, between files and between the bounded sleeps of the rate);
4. the streaming verifier (``engine/verify.py``) over the job's directory, every read charged to
   a token bucket (``archive/scrubs.py``) of ``ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND``;
5. a chain that does not verify is rebuilt from the source when ``ORBIT_ARCHIVE_SCRUB_REPAIR``
   is on (``engine/repair.py``, the files kept only when they are the originals) and verified
   again;
6. the result recorded under the lease (an audit row and the failure counter when it did not
   verify); after the time slice the pass releases the storage and sends a continuation wake-up
   when more is due, so archive deliveries on the same queue take their turns.

A job is verified in one go: at most ``max_bytes`` / rate seconds (1 GiB at 8 MiB/s: ~2 min);
the scrub task's own time limits allow it (``archive/tasks.py``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Engine

from orbit_tasks import counters
from orbit_tasks.archive import claims
from orbit_tasks.archive import controls as control_rules
from orbit_tasks.archive.controls import WaitReason
from orbit_tasks.archive.engine import gate
from orbit_tasks.archive.engine.storage import JobFiles, Place, open_storage
from orbit_tasks.archive.engine.verify import verify_job_dir
from orbit_tasks.archive.engine.volume import ArchiveIOError
from orbit_tasks.archive.format.manifest import decode_manifest
from orbit_tasks.archive.format.names import parse_name
from orbit_tasks.archive.format.values import FormatError
from orbit_tasks.archive.jobs import Job, JobFailure, JobState
from orbit_tasks.archive.scrubs import (
    ScrubOutcome,
    ScrubStop,
    TokenBucket,
    due_before,
    sleeps,
)
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import scrubs as store
from orbit_tasks.archive.wakeups import ScrubPublisher
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.ids import new_id
from orbit_tasks.logs import log_action
from orbit_tasks.settings import Settings
from orbit_tasks.timestamps import parse_ts

log = logging.getLogger("orbit.archive.engine.scrub")

#: The controls a scrub honours (the archive's own, less the throttle of roots and the replica:
#: a scrub reads the storage, not the source).
SCRUB_CHECKS: list[control_rules.Check] = [
    control_rules.paused,
    control_rules.outside_window,
    control_rules.db_loaded,
]
_STOPS = {
    WaitReason.PAUSED: ScrubStop.PAUSED,
    WaitReason.WINDOW: ScrubStop.WINDOW,
    WaitReason.DB_LOAD: ScrubStop.DB_LOAD,
}
#: How often a scrub reading a job renews its lease and looks at the controls.
CHECK_SECONDS = 1.0


class _Stop(Exception):
    """The pass ends now, before the job in hand is recorded (it stays due)."""

    def __init__(self, stop: ScrubStop) -> None:
        super().__init__(stop.value)
        self.stop = stop


@dataclass(frozen=True)
class ScrubResult:
    """One job's scrub as recorded."""

    job: Job
    outcome: ScrubOutcome
    first_bad_file: str
    reason: str
    files_read: int
    bytes_read: int
    seconds: float
    checked_at: datetime | None = None

    def as_dict(self) -> dict[str, object]:
        rate = self.bytes_read / self.seconds if self.seconds > 0 else None
        return {
            "namespace_id": self.job.namespace_id.hex(), "job_id": self.job.id.hex(),
            "kind": self.job.kind, "storage_id": self.job.storage_id.hex(),
            "outcome": self.outcome.value, "first_bad_file": self.first_bad_file or None,
            "reason": self.reason or None, "files_read": self.files_read,
            "bytes_read": self.bytes_read, "seconds": round(self.seconds, 3),
            "bytes_per_second": None if rate is None else round(rate, 1),
        }  # fmt: skip


@dataclass
class PassReport:
    """What one pass over a storage did."""

    storage_id: bytes
    stop: ScrubStop = ScrubStop.DONE
    results: list[ScrubResult] = field(default_factory=list)
    holder: str | None = None  # with BUSY: who holds the storage
    continued: bool = False  # a continuation wake-up was sent

    @property
    def failed(self) -> int:
        return sum(r.outcome is ScrubOutcome.BAD for r in self.results)


class _Reader:
    """A job directory whose every read is charged to the storage's bucket (and whose manifest
    is kept to record its range); between reads and during the sleeps ``check`` runs."""

    def __init__(self, inner: JobFiles, bucket: TokenBucket, check: Callable[[], None]) -> None:
        self.inner, self.bucket, self.check = inner, bucket, check
        self.files = 0
        self.bytes = 0
        self.manifest: bytes | None = None

    @property
    def where(self) -> str:
        return self.inner.where

    def exists(self) -> bool:
        return self.inner.exists()

    def names(self) -> list[str]:
        return self.inner.names()

    def read(self, name: str) -> bytes:
        self.check()
        try:
            data = self.inner.read(name)
        except FileNotFoundError:
            raise  # a missing file is damage: the verifier names it
        except ArchiveIOError:
            # an unreadable storage (an S3 outage past its retries, an EIO) is no verdict on
            # the file: the pass ends, nothing is recorded, the job stays due
            raise _Stop(ScrubStop.IO_ERROR) from None
        self.files += 1
        self.bytes += len(data)
        parsed = parse_name(name)
        if parsed is not None and parsed.seq == 0:
            self.manifest = data
        for pause in sleeps(self.bucket.charge(len(data), time.monotonic())):
            time.sleep(pause)
            self.check()
        return data


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class _Pass:
    engine: Engine
    conn: Connection
    storage_id: bytes
    lease_id: bytes
    settings: Settings
    clock: Clock
    actor: str
    last_check: float = 0.0

    def renew(self) -> None:
        if not store.renew_lease(
            self.conn, self.storage_id, self.lease_id, self.settings.archive_lease_seconds,
            self.clock,
        ):  # fmt: skip
            raise _Stop(ScrubStop.LEASE_LOST)


def _controls_stop(g: gate.Gate) -> ScrubStop | None:
    reason = control_rules.first_wait(g.job, g.situation(), SCRUB_CHECKS)
    return None if reason is None else _STOPS.get(reason, ScrubStop.PAUSED)


def scrub_storage(
    engine: Engine,
    storage_id: bytes,
    place: Place,
    settings: Settings,
    *,
    clock: Clock = DB_CLOCK,
    namespace_id: bytes | None = None,
    job_id: bytes | None = None,
    publish: ScrubPublisher | None = None,
    slice_seconds: float | None = None,
    source_engine: Engine | None = None,
    actor: str | None = None,
) -> PassReport:
    """One pass over ``storage_id`` mounted at ``place``: the due jobs (of ``namespace_id``
    when given), or only ``job_id`` (due or not). ``publish``: where a continuation goes after
    ``slice_seconds`` (None: the pass runs until nothing is due, the command's way)."""
    report = PassReport(storage_id)
    if job_id is None and settings.archive_scrub_days == 0:
        report.stop = ScrubStop.OFF
        return report
    storage = open_storage(place, retry_seconds=settings.archive_lease_seconds / 3)
    lease_id = new_id()
    started = time.monotonic()
    bucket = TokenBucket(float(settings.archive_scrub_bytes_per_second))
    with engine.connect() as conn:
        lease_seconds = settings.archive_lease_seconds
        if not store.take_lease(conn, storage_id, lease_id, lease_seconds, _holder(), clock):
            with conn.begin():
                held = store.lease_holder(conn, storage_id, clock)
            report.stop = ScrubStop.BUSY
            report.holder = None if held is None else held[0]
            return report
        run = _Pass(engine, conn, storage_id, lease_id, settings, clock, actor or settings.actor)
        try:
            report.stop = _jobs(run, storage, bucket, report, namespace_id, job_id,
                                publish, slice_seconds, started, source_engine)  # fmt: skip
        except _Stop as stop:
            report.stop = stop.stop
        finally:
            store.release_lease(conn, storage_id, lease_id, clock)
        if report.stop is ScrubStop.SLICE and publish is not None:
            publish(storage_id)
            report.continued = True
    log_action(
        log, "archive.scrub.pass", storage_id=storage_id, stop=report.stop.value,
        jobs=len(report.results), failed=report.failed,
        bytes_read=sum(r.bytes_read for r in report.results),
    )  # fmt: skip
    return report


def _jobs(
    run: _Pass,
    storage: object,
    bucket: TokenBucket,
    report: PassReport,
    namespace_id: bytes | None,
    job_id: bytes | None,
    publish: ScrubPublisher | None,
    slice_seconds: float | None,
    started: float,
    source_engine: Engine | None,
) -> ScrubStop:
    seen: set[tuple[bytes, bytes]] = set()
    while True:
        job = _next(run, namespace_id, job_id, seen)
        if job is None:
            return ScrubStop.DONE
        seen.add((job.namespace_id, job.id))
        g = gate.open_gate(run.conn, gate.view(job), run.settings, run.clock, waits=False)
        stop = _controls_stop(g)
        if stop is not None:
            return stop
        result = _scrub_job(run, storage, job, bucket, g, source_engine)
        report.results.append(result)
        if job_id is not None:
            return ScrubStop.DONE
        if slice_seconds is not None and time.monotonic() - started >= slice_seconds:
            with run.conn.begin():
                more = store.any_due(
                    run.conn, run.storage_id,
                    due_before(run.clock.now(run.conn), run.settings.archive_scrub_days),
                )  # fmt: skip
            return ScrubStop.SLICE if more and publish is not None else ScrubStop.DONE


def _next(
    run: _Pass, namespace_id: bytes | None, job_id: bytes | None, seen: set[tuple[bytes, bytes]]
) -> Job | None:
    with run.conn.begin():
        if job_id is not None:
            if seen:
                return None
            assert namespace_id is not None
            return job_store.get_job(run.conn, namespace_id, job_id)
        before = due_before(run.clock.now(run.conn), run.settings.archive_scrub_days)
        # a job recorded by this pass is not due any more; `seen` guards a clock standing still
        for job in store.due_jobs(run.conn, run.storage_id, before, 1 + len(seen), namespace_id):
            if (job.namespace_id, job.id) not in seen:
                return job
    return None


def _scrub_job(
    run: _Pass,
    storage: object,
    job: Job,
    bucket: TokenBucket,
    g: gate.Gate,
    source_engine: Engine | None,
) -> ScrubResult:
    def check() -> None:
        mono = time.monotonic()
        if mono - run.last_check < CHECK_SECONDS:
            return
        run.last_check = mono
        run.renew()
        if g.changed(run.conn):
            g.reload(run.conn)
        stop = _controls_stop(g)
        if stop is not None:
            raise _Stop(stop)

    files = storage.job(job.namespace_id, job.id)  # type: ignore[attr-defined]
    began = time.monotonic()
    bucket.start(began)
    reader = _Reader(files, bucket, check)
    expect = claims.chain_expectation(job, complete=job.state is JobState.SUCCEEDED)
    verified = verify_job_dir(cast(JobFiles, reader), expect)  # reads only: no write method
    outcome = ScrubOutcome.OK if verified.ok else ScrubOutcome.BAD
    bad, why = verified.first_bad_file or "", verified.reason or ""
    if (
        not verified.ok
        and run.settings.archive_scrub_repair
        and _repair(run, files, job, source_engine)
    ):
        again = verify_job_dir(cast(JobFiles, reader), expect)
        if again.ok:
            outcome = ScrubOutcome.REPAIRED
    seconds = time.monotonic() - began
    write = store.ScrubWrite(
        job=job, outcome=outcome, first_bad_file=bad, reason=why, files_read=reader.files,
        bytes_read=reader.bytes, read_ms=round(seconds * 1000), **_manifest_range(reader),
    )  # fmt: skip
    try:
        at = store.record(
            run.conn, (run.storage_id, run.lease_id), write,
            seconds=run.settings.archive_lease_seconds, actor=run.actor, clock=run.clock,
        )  # fmt: skip
    except store.ScrubLeaseLost:
        raise _Stop(ScrubStop.LEASE_LOST) from None
    result = ScrubResult(job, outcome, bad, why, reader.files, reader.bytes, seconds, at)
    _count(job, result)
    return result


def _manifest_range(reader: _Reader) -> dict[str, Any]:
    """The range of the manifest read (when it decoded): what the job archived, proven by the
    chain that just verified."""
    if reader.manifest is None:
        return {}
    try:
        rng = decode_manifest(reader.manifest)["range"]
        return {
            "range_from": None if rng["from"] is None else parse_ts(rng["from"]),
            "from_id": bytes.fromhex(rng["from_id"]) if rng.get("from_id") else None,
            "range_until": parse_ts(rng["until"]),
            "until_id": bytes.fromhex(rng["until_id"]) if rng.get("until_id") else None,
        }
    except (FormatError, KeyError, TypeError, ValueError):
        return {}


def _repair(run: _Pass, files: JobFiles, job: Job, source_engine: Engine | None) -> bool:
    """ORBIT_ARCHIVE_SCRUB_REPAIR: rebuild the damaged files from the source, kept only when
    they are the originals (``orbit job repair``'s code). True: every damaged file was put back."""
    # Imported here: only a scrub that found damage with repair on pays for the read-ahead.
    from orbit_tasks.archive.engine import repair

    with run.conn.begin():
        try:
            rng = job_store.job_range(run.conn, job)
        except JobFailure:
            return False
    fixed = repair.repair_job(files, job, rng, source_engine or run.engine, dry_run=False)
    if fixed.files:
        job_store.record_repair(
            run.engine, job.namespace_id, job.id, actor=run.actor,
            detail={"by": "scrub", "rebuilt": [f.seq for f in fixed.files
                                                if f.action == repair.REBUILT]},
        )  # fmt: skip
    return fixed.ok


def _count(job: Job, result: ScrubResult) -> None:
    storage = job.storage_id.hex()
    counters.ARCHIVE_SCRUB_BYTES.labels(storage).inc(result.bytes_read)
    if result.outcome is ScrubOutcome.OK:
        log_action(
            log, "archive.scrub.verified", namespace_id=job.namespace_id, job_id=job.id,
            storage_id=job.storage_id, bytes_read=result.bytes_read,
            seconds=round(result.seconds, 3),
        )  # fmt: skip
        return
    if result.outcome is ScrubOutcome.BAD:
        counters.ARCHIVE_SCRUB_FAILURES.labels(storage).inc()
    log_action(
        log, "archive.scrub.failed" if result.outcome is ScrubOutcome.BAD
        else "archive.scrub.repaired", logging.WARNING, namespace_id=job.namespace_id,
        job_id=job.id, storage_id=job.storage_id, first_bad_file=result.first_bad_file,
        reason=result.reason,
    )  # fmt: skip
