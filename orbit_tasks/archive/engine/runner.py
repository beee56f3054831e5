"""One Celery delivery of an archive job: claims, one confirmed file per claim (SPEC §5).

``run_job`` claims the job (PENDING, or RUNNING with an expired lease = takeover) and then runs
a *claim chain*: each confirm of a file takes the next claim in the same statement, until the
job is final (the final step) or the time slice is over (release to PENDING + continuation
wake-up). Any fenced write that matches no row means the lease is lost: stop, write nothing
more. Transient database faults are never job failures: stop and let the lease expire (or the
job was already released).

What a chain does once, and what it does per batch (docs/archive-jobs.md, "The runner"):

* once, at its first claim: check the volume, derive the range, verify the confirmed prefix --
  the tail file only after a claim from PENDING (opened by name, no listing), the whole chain
  after a takeover (listing the directory, removing leftovers under the lease check);
* per batch: the next file comes ready from the read-ahead thread (:mod:`readahead`); the
  volume identity is checked, the file is written durably and confirmed by one fenced UPDATE
  that also takes the next claim, with the database clock inside it. What the chain confirmed
  (counters, tail name, cursor, range) is carried in Python, never re-read;
* at the end: the final step lists the directory and verifies the whole chain, one file at a
  time, with the same streaming verifier ``orbit job verify`` uses -- resumable across claims
  when it does not fit one delivery's time (issue 24 item 4).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine

from orbit_tasks import counters, failpoints, shutdown
from orbit_tasks.archive import claims as claim_rules
from orbit_tasks.archive.claims import file_cap, is_stalled, over_budget
from orbit_tasks.archive.controls import REPLICA_BEAT, REPLICA_ERRANT, WaitReason
from orbit_tasks.archive.engine import claim_marks, gate, leftovers, verify
from orbit_tasks.archive.engine.budget import fit_range, manifest_bytes, manifest_file
from orbit_tasks.archive.engine.gate import Gate
from orbit_tasks.archive.engine.objects import NoSuchBucket, StorageDenied, StorageUnavailable
from orbit_tasks.archive.engine.readahead import NOT_READY, NotReady, PreparedBatch, ReadAhead
from orbit_tasks.archive.engine.reader_process import ProcessReadAhead, open_read_ahead
from orbit_tasks.archive.engine.storage import JobFiles, Place, Storage, open_storage, store_files
from orbit_tasks.archive.engine.storage import parse_volumes as parse_volumes
from orbit_tasks.archive.engine.volume import ArchiveIOError, DiskFull, StoredFile
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.format.expectation import ChainExpectation, VerifyReport
from orbit_tasks.archive.jobs import (
    ErrorCode,
    JobFailure,
    claimable,
)
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import jobs as store
from orbit_tasks.archive.store import source
from orbit_tasks.archive.wakeups import Publisher, publish_wakeup
from orbit_tasks.archive_limits import max_slice_seconds
from orbit_tasks.db import gtid
from orbit_tasks.db.engine import DB_CLOCK, Clock, single_statements
from orbit_tasks.db.faults import driver_code, is_transient_db
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.db.registry import source_engine as registry_source_engine
from orbit_tasks.errors import InvalidInput, LeaseLost, ReaderLost, ReplicaDiverged
from orbit_tasks.ids import from_hex
from orbit_tasks.logs import log_action
from orbit_tasks.settings import Settings

log = logging.getLogger("orbit.archive.engine.runner")


class Outcome(enum.StrEnum):
    """What one delivery did: the word :func:`run_job` returns (logs, tests)."""

    MISSING = "missing"  # no such job
    NOT_MOUNTED = "not_mounted"  # this worker does not mount the job's storage
    NOT_CLAIMED = "not_claimed"  # another claim holds a live lease, or the job is final
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RELEASED = "released"  # the time slice is over: PENDING again, a continuation wake-up sent
    LEASE_LOST = "lease_lost"  # a fenced write matched no row: stopped, nothing more written
    TRANSIENT = "transient"  # a transient database fault: stopped, the lease will expire
    WAITING = "waiting"  # a control or the load guard says wait: not claimed, the wait recorded
    STOPPED = "stopped"  # the same found at a batch boundary: released to PENDING, wait recorded
    CHAINED = "chained"  # internal: a confirm that took the next claim in the same statement


#: How the runner's chain checks decode batch lines: the first and the last line of every
#: file (with every file's SHA-256, gzip CRC, header and line count). Every byte of a file is
#: covered by its verified SHA-256 and was encoded by this runner; re-parsing every line cost
#: two thirds of a worker's CPU (docs/archive-jobs.md). ``orbit job verify`` parses them all.
CHAIN_LINES = "ends"


@dataclass(frozen=True, kw_only=True)
class _Delivery:
    """What one delivery's claim chain works with: fixed when its first claim is taken."""

    engine: Engine
    conn: Connection  # the chain's one connection for its claims and confirms
    source_db: Engine  # where history is read: the replica, or ``engine`` itself
    volume: Storage  # a folder or an S3 prefix (engine/storage.py)
    directory: JobFiles
    settings: Settings
    clock: Clock
    started: float  # monotonic start of the delivery (the time limits count from it)
    gate: Gate | None = None  # the controls of the chain (None: off, the bench's baseline)

    @property
    def deadline(self) -> float:
        """The monotonic end of the time slice: over at once when the worker is shutting down
        (SIGTERM, orbit_tasks/shutdown.py), so that the claim confirms the file in hand,
        releases the job and sends its continuation now (a rolling restart)."""
        if shutdown.requested():
            return 0.0
        return self.started + self.settings.archive_slice_seconds


@dataclass(kw_only=True)
class _Chain:
    """What a claim chain carries from one claim to the next (never re-read)."""

    run: _Delivery
    claim: store.Claim
    stopped: WaitReason | None = None  # why the chain released at a batch boundary
    rng: ArchiveRange | None = None  # derived once per chain
    recorded: store.RecordedEnd | None = None  # the range's recorded end (None: not yet)
    policy_until: datetime | None = None  # the end the job's policy gives (before any cut)
    next_job: bytes | None = None  # the catch-up job finalize created (SPEC §5)
    cursor: source.Cursor | None = None  # (settled, id) of the tail's last root
    tail_final: bool = False  # the confirmed tail says nothing follows
    identity_stamp: object = None  # the verified identity's stamp (a stat, an ETag)


def run_job(
    ns_hex: str,
    job_hex: str,
    volumes: Mapping[str, Place],
    settings: Settings,
    *,
    engine: Engine | None = None,
    source_engine: Engine | None = None,
    publish: Publisher | None = None,
    clock: Clock = DB_CLOCK,
) -> Outcome:
    """Handle one wake-up; plans, leases, confirms and the manifest's count on ``engine`` (the
    platform database), every batch read on ``source_engine`` (``ORBIT_ARCHIVE_SOURCE_URL``, a
    replica, each chunk checked against ``engine``; default: the registry's source when
    ``engine`` is the registry's too, else ``engine``). Returns an outcome word (for logs and
    tests): ``missing``, ``not_mounted``, ``not_claimed``, ``waiting``, ``succeeded``,
    ``failed``, ``released``, ``stopped``, ``lease_lost``, ``transient``."""
    started = time.monotonic()
    if engine is None:
        engine = platform_engine()
        source_engine = source_engine or registry_source_engine()
    source_engine = source_engine or engine
    ns_id, job_id = from_hex(ns_hex, "namespace id"), from_hex(job_hex, "job id")
    try:
        with engine.connect() as conn:
            conn = single_statements(conn)  # no lock outlives a statement but finalize's
            with conn.begin():
                job = store.get_job(conn, ns_id, job_id)
            if job is None:
                log_action(log, "archive.job.missing", namespace_id=ns_hex, job_id=job_hex)
                return Outcome.MISSING
            volume = volumes.get(job.storage_id.hex())
            if volume is None:
                log_action(
                    log, "archive.job.not_mounted", namespace_id=ns_hex, job_id=job_hex,
                    storage_id=job.storage_id,
                )  # fmt: skip
                return Outcome.NOT_MOUNTED
            g = None
            if settings.archive_controls:
                g = gate.open_gate(conn, gate.view(job), settings, clock)
                # only a job this wake-up could claim waits (a live or final one: not_claimed)
                if claimable(job.state, job.lease_until, g.db_now):
                    if source_engine is not engine:  # a replica: a copy, up to the job's tick?
                        g.extra[REPLICA_ERRANT] = _errant_gtids(source_engine, conn)
                        g.extra[REPLICA_BEAT] = _replica_beat(source_engine)
                    reason = g.wait_before_claim(conn, job.batch_size, started)
                    if reason is not None:
                        log_action(
                            log, "archive.job.waiting", namespace_id=job.namespace_id,
                            job_id=job.id, reason=reason.value,
                        )  # fmt: skip
                        return Outcome.WAITING
            c = store.claim(conn, ns_id, job_id, settings.archive_lease_seconds, clock=clock)
            if c is None:
                log_action(log, "archive.job.not_claimed", namespace_id=ns_hex, job_id=job_hex)
                return Outcome.NOT_CLAIMED
            claim_marks.hold(ns_id, job_id, c.lease_id)  # for the main process if we die
            if g is not None:
                g.claimed(conn, c.claimed_at)
            log_action(
                log,
                "archive.job.takeover" if c.takeover else "archive.job.claimed",
                namespace_id=ns_id,
                job_id=job_id,
                attempts=c.job.attempts,
                batches=c.job.batches,
            )
            if c.takeover:
                counters.ARCHIVE_TAKEOVERS.labels(job.storage_id.hex()).inc()
            failpoints.hit("archive.after_claim")
            storage = _open(volume, settings)
            run = _Delivery(
                engine=engine, conn=conn, source_db=source_engine, volume=storage,
                directory=storage.job(ns_id, job_id), settings=settings, clock=clock,
                started=started, gate=g,
            )  # fmt: skip
            ch = _Chain(run=run, claim=c)
            if c.takeover and is_stalled(
                c.job.attempts, c.job.batches, settings.archive_max_stalls
            ):
                failed = _fail(ch, ErrorCode.STALLED)
                if failed is Outcome.FAILED:
                    counters.ARCHIVE_STALLS.labels(job.storage_id.hex()).inc()
                return failed
            return _run_chain(ch, publish)
    except Exception as exc:
        if isinstance(exc, StorageUnavailable):  # retried for a third of the lease: stop
            log_action(
                log, "archive.job.storage_unavailable", logging.WARNING, namespace_id=ns_hex,
                job_id=job_hex, error=str(exc),
            )  # fmt: skip
            return Outcome.TRANSIENT
        if is_transient_db(exc) or isinstance(exc, ReaderLost):
            log_action(
                log, "archive.job.transient", logging.WARNING, namespace_id=ns_hex,
                job_id=job_hex, error=type(exc).__name__, code=driver_code(exc),
            )  # fmt: skip
            return Outcome.TRANSIENT
        raise


def _errant_gtids(source_engine: Engine, conn: Connection) -> list[str]:
    """The replica's GTIDs the primary has not executed (``db/gtid.py``; the replica first)."""
    with source_engine.connect() as replica, conn.begin():
        found = gtid.errant_gtids(replica, conn)
    if found:
        log_action(
            log, "archive.replica.errant_gtids", logging.WARNING, gtids=gtid.describe(found)
        )  # fmt: skip
    return found


def _replica_beat(source_engine: Engine) -> datetime | None:
    """The tick heartbeat as the replica has applied it (one statement on the replica)."""
    with source_engine.connect() as conn:
        return source.replica_beat(conn)


def _run_chain(ch: _Chain, publish: Publisher | None) -> Outcome:
    try:
        outcome = _claims(ch)
    except JobFailure as failure:
        return _fail(ch, failure.code)
    except LeaseLost:
        _lost(ch.claim)
        return Outcome.LEASE_LOST
    except ReplicaDiverged as diverged:
        return _diverged(ch, str(diverged))
    if outcome is Outcome.STOPPED:
        # no continuation (the tick wakes waiting jobs up), except for the throttle: its wait
        # is a turn of seconds, which the next claim sleeps before claiming
        if ch.stopped is WaitReason.THROTTLED:
            _publish_continuation(ch, publish)
        return outcome
    if outcome is Outcome.RELEASED:
        job = ch.claim.job
        log_action(
            log, "archive.job.released", namespace_id=job.namespace_id, job_id=job.id,
            shutdown=shutdown.requested(),
        )  # fmt: skip
        _publish_continuation(ch, publish)
    if outcome is Outcome.SUCCEEDED and ch.next_job is not None:
        _publish_continuation(ch, publish, ch.next_job)  # the catch-up's next job
    return outcome


def _publish_continuation(
    ch: _Chain, publish: Publisher | None, job_id: bytes | None = None
) -> None:
    """The wake-up of the chain's job (a continuation), or of ``job_id``: the catch-up job of
    the same plan, which a tick created with the plan's storage (the wake-up names the job's
    own storage: a plan moved to another storage sends it there, and the tick's sweep finds
    it anyway)."""
    job = ch.claim.job
    if publish is None:
        publish = publish_wakeup
    try:
        publish(job.storage_id, job.namespace_id, job_id or job.id, kind=job.kind)
    except Exception as exc:  # broker down: the next tick's sweep finds the PENDING job
        log_action(
            log, "archive.job.wakeup_failed", logging.WARNING, job_id=job.id,
            error=type(exc).__name__,
        )  # fmt: skip


def _fail(ch: _Chain, code: ErrorCode) -> Outcome:
    c = ch.claim
    try:
        store.fail(ch.run.conn, c, code, clock=ch.run.clock)
    except LeaseLost:
        _lost(c)
        return Outcome.LEASE_LOST
    log_action(
        log, "archive.job.failed", logging.WARNING, namespace_id=c.job.namespace_id,
        job_id=c.job.id, error_code=code.value, batches=c.job.batches,
    )  # fmt: skip
    return Outcome.FAILED


def _diverged(ch: _Chain, detail: str) -> Outcome:
    """A chunk read from the replica differs from the primary's (issue 24): nothing of it was
    written; the claim is given back without confirming (fenced, its attempt not counted: it is
    a wait, not a stall) and the job waits ``replica_diverged`` until a wake-up finds the replica
    agreeing again."""
    c = ch.claim
    job = c.job
    try:
        store.release(ch.run.conn, c, clock=ch.run.clock, count_attempt=False)
    except LeaseLost:
        _lost(c)
        return Outcome.LEASE_LOST
    ch.stopped = WaitReason.REPLICA_DIVERGED
    gate.record_wait(
        ch.run.conn, job.namespace_id, job.id, WaitReason.REPLICA_DIVERGED, ch.run.clock
    )
    log_action(
        log, "archive.job.replica_diverged", logging.WARNING, namespace_id=job.namespace_id,
        job_id=job.id, batches=job.batches, detail=detail,
    )  # fmt: skip
    return Outcome.STOPPED


def _lost(c: store.Claim) -> None:
    log_action(
        log, "archive.job.lease_lost", logging.WARNING, namespace_id=c.job.namespace_id,
        job_id=c.job.id,
    )  # fmt: skip


# --- the chain ----------------------------------------------------------------------------------


def _claims(ch: _Chain) -> Outcome:
    """Steps 1-5 for every claim of the chain; returns ``succeeded`` or ``released``. Raises
    JobFailure / LeaseLost (handled by the caller)."""
    try:
        _check_volume(ch)  # step 1
        with ch.run.conn.begin():
            # once per chain (POLICY_MISSING), with the policy's end and the recorded end
            known = store.chain_range(ch.run.conn, ch.claim.job)
            ch.rng, ch.policy_until, ch.recorded = known.range, known.policy_until, known.recorded
        _verify_prefix(ch)  # step 2
        if not ch.claim.job.has_manifest:  # step 3: the manifest fixes range and roots_total
            data, total = _primary_manifest(ch)
            sha = fv.sha256_hex(data)
            manifest = _File(
                name=file_names.manifest_name(sha), sha256=sha, data=data, roots=0,
                final=total == 0, is_batch=False,
            )  # fmt: skip
            _refuse(_admit(ch, manifest, ch.claim.job.bytes))
            stored = ch.run.directory.store(manifest.name, manifest.data)
            _written(ch, manifest)
            outcome = _confirm(ch, [manifest], [stored], None, _boundary(ch, manifest))
            if outcome is not Outcome.CHAINED:
                return outcome
        if ch.tail_final:
            return _finish(ch)
        return _batches(ch)
    except fv.SourceInvalid:
        raise JobFailure(ErrorCode.SOURCE_INVALID) from None
    except DiskFull:
        raise JobFailure(ErrorCode.DISK_FULL) from None
    except StorageDenied:
        raise JobFailure(ErrorCode.ACCESS_DENIED) from None
    except NoSuchBucket:
        raise JobFailure(ErrorCode.NO_SUCH_BUCKET) from None
    except ArchiveIOError:
        raise JobFailure(ErrorCode.IO_ERROR) from None


@dataclass(frozen=True, kw_only=True)
class _File:
    """A chain file about to be written and confirmed."""

    name: str
    sha256: str
    data: bytes
    roots: int
    final: bool
    is_batch: bool
    seq: int = 0
    prev_sha256: str = ""


def _batch_file(p: PreparedBatch) -> _File:
    return _File(
        name=p.name, sha256=p.sha256, data=p.data, roots=p.roots, final=p.final, is_batch=True,
        seq=p.seq, prev_sha256=p.prev_sha256,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _Group:
    """Files written as one group (group durability): the write under way in the writer
    thread, which returns the files it stored and the error that stopped it (if any)."""

    files: list[_File]
    writing: Future[tuple[list[StoredFile], Exception | None]]


def _write(ch: _Chain, writer: ThreadPoolExecutor, files: list[_File]) -> _Group:
    items = [(f.name, f.data) for f in files]
    return _Group(files=files, writing=writer.submit(store_files, ch.run.directory, items))


def _batches(ch: _Chain) -> Outcome:
    """Steps 3-4 for each batch, a group of files at a time (group durability, docs/archive-
    jobs.md "Write-ahead depth"). The read-ahead thread prepares the files; the prepared ones
    are admitted one by one (step 1 and the budget, counting every file ahead) into a group of
    up to ``GROUP_FILES`` (one file while a control or the load guard is in force); a writer
    thread writes the group durably (each file synced, one
    directory sync), and ONE fenced statement confirms the group and takes the next claim.
    While that confirm is in flight the next group is written ahead (files beyond the
    confirmed prefix: if the lease is lost they are leftovers, removed by step 6 or the next
    owner). Every error of a file (step 1, budget, the write itself) takes effect only after
    the files before it are confirmed, as if the files were handled one after the other."""
    job = ch.claim.job
    assert ch.rng is not None
    run = ch.run
    primary = None if run.source_db is run.engine else run.engine  # a replica: check its chunks
    with (
        open_read_ahead(
            run.settings.archive_reader,
            run.source_db,
            job,
            ch.rng,
            ch.cursor,
            file_cap(job.max_bytes),
            primary,
        ) as ahead,
        ThreadPoolExecutor(1, thread_name_prefix="archive-write") as writer,
    ):
        upcoming: PreparedBatch | None | NotReady = ahead.next()
        written: _Group | None = None  # written ahead of the confirm in flight
        while True:
            if written is None:  # nothing written ahead: step 1, budget and the write now
                if upcoming is NOT_READY:
                    upcoming = ahead.next()
                if upcoming is None:  # the source ran out before a final batch: the final
                    return _finish(ch)  # step tells SOURCE_CHANGED
                job = ch.claim.job
                files, upcoming = _collect(ch, ahead, upcoming, None, job.bytes)
                written = _write(ch, writer, files)
            group, written = written, None
            stored, error = group.writing.result()
            files = group.files[: len(stored)]
            if not files:
                assert error is not None
                raise error
            for f in files:
                _written(ch, f)
            failpoints.hit("archive.after_group_write")  # durable, nothing written after it
            last = files[-1]
            stop = _boundary(ch, last, sum(f.roots for f in files))
            if error is None and not last.final and stop is None:
                if time.monotonic() < ch.run.deadline and upcoming is NOT_READY:
                    upcoming = ahead.ready()  # write the next group ahead only if it is ready
                if time.monotonic() < ch.run.deadline and isinstance(upcoming, PreparedBatch):
                    before = ch.claim.job.bytes + sum(len(f.data) for f in files)
                    follow, upcoming = _collect(ch, ahead, upcoming, last, before)
                    if follow:  # else: refused, checked again after this confirm
                        written = _write(ch, writer, follow)
            outcome = _confirm(ch, files, stored, written, stop)
            if outcome is not Outcome.CHAINED:
                return outcome
            if error is not None:  # the files before it are confirmed: now it fails the job
                raise error


def _collect(
    ch: _Chain,
    ahead: ReadAhead | ProcessReadAhead,
    first: PreparedBatch,
    after: _File | None,
    bytes_before: int,
) -> tuple[list[_File], PreparedBatch | NotReady]:
    """A group: ``first`` and the prepared files that are ready after it, each admitted (step 1
    and the budget, with ``bytes_before`` + the group's bytes), up to ``GROUP_FILES`` and a
    final file. ``after``: the file the group follows, not confirmed yet (written ahead), or
    None for a group that extends the confirmed tail: then a refused first file fails the job
    now; else it is returned, unwritten, to be admitted again after the confirm. Returns the
    group and the file to go on with (``NOT_READY`` when none is in hand)."""
    files: list[_File] = []
    size = 0
    controlled = ch.run.gate is not None and not ch.run.gate.idle
    # a time slice already over confirms one file and releases (as before groups): a group would
    # carry the claim past its slice
    controlled = controlled or time.monotonic() >= ch.run.deadline
    item: PreparedBatch | NotReady = first
    while isinstance(item, PreparedBatch):
        f = _batch_file(item)
        prev = files[-1] if files else after
        if prev is None:  # the thread builds on the chain this claim extends (our tail)
            job = ch.claim.job
            assert (f.seq, f.prev_sha256) == (job.batches + 1, job.last_sha256)
        else:
            assert (f.seq, f.prev_sha256) == (prev.seq + 1, prev.sha256)
        if not claim_rules.group_has_room(len(files), size, len(f.data), controlled=controlled):
            return files, item
        code = _admit(ch, f, bytes_before + size)
        if code is not None:
            if not files and after is None:
                raise JobFailure(code)
            return files, item
        files.append(f)
        size += len(f.data)
        if f.final:
            return files, NOT_READY
        item = ahead.ready()
    return files, NOT_READY


def _boundary(ch: _Chain, f: _File, roots: int | None = None) -> WaitReason | None:
    """The batch boundary before the confirm that ends with ``f`` (of ``roots`` roots in all:
    a group's; default ``f``'s): a reason to release instead of chaining the next claim (a
    final file is confirmed with its lease kept whatever the controls say)."""
    if f.final or ch.run.gate is None:
        return None
    return ch.run.gate.at_boundary(
        ch.run.conn, f.seq, f.roots if roots is None else roots, ch.run.deadline
    )


def _check_volume(ch: _Chain) -> None:
    """Step 1: the mounted volume is the job's storage (checked on every claim: a disk swapped
    under a running worker is caught before anything is written). The identity file is read
    again whenever its stamp changes (a folder's ``stat``: another disk mounted there has
    another device and inode; a rewritten file another inode or mtime; an object's ETag); a
    claim whose stamp matches the one already verified in this chain costs one ``stat`` (one
    GET of the identity object on S3)."""
    try:
        stamp = ch.run.volume.identity_stamp()
    except OSError:
        raise JobFailure(ErrorCode.STORAGE_MISMATCH) from None
    if stamp == ch.identity_stamp:
        return
    try:
        ident = ch.run.volume.identity()
    except InvalidInput:
        raise JobFailure(ErrorCode.STORAGE_MISMATCH) from None
    if ident.storage_id != ch.claim.job.storage_id:
        raise JobFailure(ErrorCode.STORAGE_MISMATCH)
    ch.identity_stamp = stamp


def _expectation(ch: _Chain, c: store.Claim | None = None) -> ChainExpectation:
    assert ch.rng is not None
    expect = claim_rules.chain_expectation((c or ch.claim).job, complete=False)
    return claim_rules.with_range(expect, ch.rng)


def _verify_prefix(ch: _Chain) -> None:
    """Step 2. After a claim from PENDING: the tail file only (the chain before it was verified
    when it was confirmed; leftovers wait for the final step). After a takeover: the whole
    confirmed chain, then the dead claims' leftovers go -- but only under a live lease (a claim
    paused past its lease must not take the new owner's files for leftovers)."""
    job = ch.claim.job
    if not ch.claim.takeover:
        if job.has_manifest:
            tail = verify.verify_job_prefix(
                ch.run.directory, _expectation(ch), io_errors=True, lines=CHAIN_LINES
            )
            _require_verified(tail, ch)
            _carry_tail(ch, tail)
        return
    names = leftovers.list_dir(ch.run.directory)
    report: VerifyReport | None = None
    if job.has_manifest:
        report = verify.verify_job_prefix(
            ch.run.directory, _expectation(ch), full=True, names=names, allow_strays=True,
            io_errors=True, lines=CHAIN_LINES,
        )  # fmt: skip
    _sweep(ch, report, names)
    if report is not None:
        _carry_tail(ch, report)


def _sweep(ch: _Chain, report: VerifyReport | None, names: list[str] | None) -> None:
    """Verify, then sweep (steps 2 and 5): ``report`` must have verified (else CHAIN_BROKEN;
    None: nothing is confirmed yet) -- only a verified chain tells confirmed files from strays
    -- and then the strays go, under the lease check (:func:`leftovers.remove`). The strays are
    those among the directory's listing ``names`` (:func:`claims.stray_names`), or, with
    ``names`` None, those of the part of the chain walked (``report.strays``)."""
    if report is not None:
        _require_verified(report, ch)
    if names is not None:
        strays = claim_rules.stray_names(names, report)
    else:
        assert report is not None
        strays = list(report.strays)
    leftovers.remove(ch.run.conn, ch.claim, ch.run.clock, ch.run.directory, strays)


def _carry_tail(ch: _Chain, report: VerifyReport) -> None:
    """The verified tail: the cursor after its last root, and whether anything follows (a
    final batch, or the manifest of a range without roots)."""
    ch.cursor = report.cursor
    ch.tail_final = report.final or (report.batches == 0 and report.roots_total == 0)


def _primary_manifest(ch: _Chain) -> tuple[bytes, int]:
    """The manifest, its range fitted to the budget and recorded first (SPEC §5 budget-sized
    ranges; a range recorded by an earlier claim is kept), its roots counted on the primary (the
    chain's own connection) even when the batches are read from a replica: the count the job
    promises is the primary's (issue 24)."""
    assert ch.rng is not None
    conn = ch.run.conn
    job = ch.claim.job
    if ch.recorded is not None:
        return manifest_file(conn, job, ch.rng)
    with conn.begin():
        fitted = fit_range(conn, job, ch.rng)
    assert ch.policy_until is not None
    recorded = store.RecordedEnd(
        fitted.range.end, ch.policy_until, fitted.roots_total, fitted.sample_roots,
        fitted.sample_bytes,
    )  # fmt: skip
    store.record_end(ch.run.conn, ch.claim, recorded, clock=ch.run.clock)
    ch.rng, ch.recorded = fitted.range, recorded
    if recorded.cut:
        log_action(
            log, "archive.job.range_cut", namespace_id=job.namespace_id, job_id=job.id,
            roots_total=fitted.roots_total, sample_roots=fitted.sample_roots,
            sample_bytes=fitted.sample_bytes, max_bytes=job.max_bytes,
        )  # fmt: skip
    return manifest_bytes(job, fitted.range, fitted.roots_total), fitted.roots_total


def _admit(ch: _Chain, f: _File, bytes_before: int) -> ErrorCode | None:
    """Step 1 of the claim that writes ``f`` and the budget rule (``bytes + size >
    max_bytes`` fails), checked before the write; returns the failure instead of raising it."""
    try:
        _check_volume(ch)
    except JobFailure as failure:
        return failure.code
    if over_budget(bytes_before, len(f.data), ch.claim.job.max_bytes):
        return ErrorCode.BUDGET_EXCEEDED
    return None


def _written(ch: _Chain, f: _File) -> None:
    """The file is durable and not confirmed (before anything is written ahead of it)."""
    job = ch.claim.job
    log_action(
        log, "archive.job.file_written", namespace_id=job.namespace_id, job_id=job.id,
        file=f.name, size=len(f.data), roots=f.roots,
    )  # fmt: skip
    failpoints.hit("archive.after_file_write")


def _refuse(code: ErrorCode | None) -> None:
    if code is not None:
        raise JobFailure(code)


def _confirm(
    ch: _Chain,
    files: list[_File],
    stored: list[StoredFile],
    follow: _Group | None,
    stop: WaitReason | None = None,
) -> Outcome:
    """Step 4 after the durable write of ``files`` (a group, in chain order): ONE fenced
    confirm of them all that chains the next claim (or keeps the lease for the final step, or
    releases the job at the end of the time slice or because ``stop`` says wait). Returns
    ``chained``, or the outcome of the final step / ``released`` / ``stopped``. ``follow`` is
    the write of the next group, already under way (only when chaining). A chained confirm
    compares the control generation inside its UPDATE; when it changed, the controls are read
    again and the boundary asked again (at most the files written ahead follow a pause)."""
    c = ch.claim
    job = c.job
    last = files[-1]
    after = store.After.KEEP if last.final else store.After.CHAIN
    if not last.final and (
        stop is not None or (follow is None and time.monotonic() >= ch.run.deadline)
    ):
        after = store.After.RELEASE
    written = [
        store.WrittenFile(is_batch=f.is_batch, roots=f.roots, size=len(f.data), sha256=f.sha256)
        for f in files
    ]
    failpoints.hit("archive.before_confirm")  # the next group may be under way
    try:
        while True:
            try:
                nxt = store.confirm_files(
                    ch.run.conn, c, written, after=after,
                    lease_seconds=ch.run.settings.archive_lease_seconds, clock=ch.run.clock,
                    generation=None if ch.run.gate is None else ch.run.gate.generation,
                )  # fmt: skip
                break
            except store.ControlsChanged:
                assert ch.run.gate is not None
                ch.run.gate.reload(ch.run.conn)
                stop = _boundary(ch, last, sum(f.roots for f in files))
                if stop is not None:
                    after = store.After.RELEASE
    except LeaseLost:
        _discard(ch, c, files, stored)
        _remove_written_ahead(ch, c, follow)
        raise
    if nxt is not None:  # at once: a child killed from here on names the claim it holds
        claim_marks.hold(job.namespace_id, job.id, nxt.lease_id)
    log_action(
        log, "archive.job.confirmed", namespace_id=job.namespace_id, job_id=job.id,
        file=last.name, files=len(files),
        batches=job.batches + sum(1 for f in files if f.is_batch),
        roots=job.roots + sum(f.roots for f in files),
        bytes=job.bytes + sum(len(f.data) for f in files), after=after,
    )  # fmt: skip
    failpoints.hit("archive.after_confirm")
    if after == store.After.RELEASE and stop is not None:
        # written ahead before the controls changed, not confirmed: step 6 leaves it while the
        # job can be claimed (a next claim may adopt it by name); else the final step removes it
        _remove_written_ahead(ch, c, follow)
        _stopped(ch, stop)
        return Outcome.STOPPED
    if after == store.After.RELEASE:
        return Outcome.RELEASED
    assert nxt is not None
    ch.claim = nxt
    if after == store.After.KEEP:
        ch.tail_final = True
        return _finish(ch)
    return Outcome.CHAINED


def _remove_written_ahead(ch: _Chain, c: store.Claim, follow: _Group | None) -> None:
    """Step 6 for the group written ahead of a confirm that did not chain: each file it stored
    goes unless a claim may still confirm it (:func:`leftovers.remove_unless_confirmed`)."""
    if follow is None:
        return
    with contextlib.suppress(Exception):  # a failed write left nothing to remove
        ahead, _error = follow.writing.result()
        _discard(ch, c, follow.files, ahead)


def _discard(ch: _Chain, c: store.Claim, files: list[_File], stored: list[StoredFile]) -> None:
    """Step 6 for the files claim ``c`` wrote and did not confirm (``stored``: what the write
    stored of ``files``, in order; a failed write stored fewer): each goes unless a claim may
    still confirm it (:func:`leftovers.remove_unless_confirmed`)."""
    for f, s in zip(files[: len(stored)], stored, strict=True):
        leftovers.remove_unless_confirmed(ch.run.conn, c, ch.run.directory, f.name, s)


def _stopped(ch: _Chain, reason: WaitReason) -> None:
    """Released at a batch boundary for ``reason``: the job's wait starts now."""
    job = ch.claim.job
    ch.stopped = reason
    assert ch.run.gate is not None
    ch.run.gate.record_wait(ch.run.conn, reason)
    log_action(
        log, "archive.job.stopped", namespace_id=job.namespace_id, job_id=job.id,
        reason=reason.value, batches=job.batches,
    )  # fmt: skip


def _require_verified(report: VerifyReport, ch: _Chain) -> None:
    """A chain that does not verify fails the job with CHAIN_BROKEN (the log names the file)."""
    if not report.ok:
        log_action(
            log, "archive.job.chain_broken", logging.WARNING, job_id=ch.claim.job.id,
            file=report.first_bad_file,
        )  # fmt: skip
        raise JobFailure(ErrorCode.CHAIN_BROKEN)


def _finish(ch: _Chain) -> Outcome:
    """Step 5: re-verify the whole chain from disk (streaming, with the range any node derives
    from the database), remove strays under the lease check, apply the SOURCE_CHANGED rule,
    then SUCCEEDED. Only a verified chain tells confirmed files from strays: a walk that
    stopped at a corrupt file would take the confirmed files after it for leftovers.

    The walk is resumable (issue 24 item 4): it goes on while the delivery is within the
    longest time slice its lease allows (``archive_limits.max_slice_seconds``, one margin before
    the soft time limit; never shorter than the configured slice; at least one file per
    claim). When that time is up, the strays of the
    part walked are removed, the progress is recorded and the job released in one fenced
    transaction, and a continuation's claim resumes the walk from it (its tail check, then the
    rest): a job of any number of files finishes, one lease at a time."""
    c = ch.claim
    job = c.job
    names = leftovers.list_dir(ch.run.directory)
    progress = store.final_progress(ch.run.conn, job)
    deadline = max(
        ch.run.deadline, ch.run.started + max_slice_seconds(ch.run.settings.archive_lease_seconds)
    )
    report, rest = verify.verify_job_part(
        ch.run.directory, _expectation(ch), names=names, progress=progress,
        more=lambda: time.monotonic() < deadline and not shutdown.requested(), lines=CHAIN_LINES,
    )  # fmt: skip
    _sweep(ch, report, None if rest is not None else names)
    if rest is not None:
        store.release_with_progress(ch.run.conn, c, rest, clock=ch.run.clock)
        log_action(
            log, "archive.job.final_step_released", namespace_id=job.namespace_id,
            job_id=job.id, checked=rest.checked, files=job.batches + 1,
        )  # fmt: skip
        return Outcome.RELEASED
    if claim_rules.source_changed(job.roots, report.roots_total, job.batches, report.final):
        raise JobFailure(ErrorCode.SOURCE_CHANGED)
    failpoints.hit("archive.before_finalize")
    catch_up = ch.recorded is not None and ch.recorded.cut
    ch.next_job = store.finalize(ch.run.conn, c, clock=ch.run.clock, catch_up=catch_up)
    log_action(
        log, "archive.job.succeeded", namespace_id=job.namespace_id, job_id=job.id,
        attempts=job.attempts, batches=job.batches, roots=job.roots, bytes=job.bytes,
        cut=catch_up,
    )  # fmt: skip
    if ch.next_job is not None:
        log_action(
            log, "archive.plan.catch_up", namespace_id=job.namespace_id, kind=job.kind,
            after_job_id=job.id, job_id=ch.next_job,
        )  # fmt: skip
    return Outcome.SUCCEEDED


def _open(volume: Place, settings: Settings) -> Storage:
    """The job's storage; an S3 request is retried for at most a third of the lease."""
    return open_storage(volume, retry_seconds=settings.archive_lease_seconds / 3)
