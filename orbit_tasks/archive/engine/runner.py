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
  time, with the same streaming verifier ``orbit job verify`` uses.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy import Connection, Engine

from orbit_tasks import failpoints
from orbit_tasks.archive import claims as claim_rules
from orbit_tasks.archive.claims import file_cap, is_stalled, over_budget
from orbit_tasks.archive.engine import leftovers, verify
from orbit_tasks.archive.engine.readahead import NOT_READY, NotReady, PreparedBatch
from orbit_tasks.archive.engine.reader_process import open_read_ahead
from orbit_tasks.archive.engine.volume import (
    IDENTITY_FILE,
    ArchiveIOError,
    DiskFull,
    StoredFile,
    job_dir,
    read_identity,
    store_job_file,
)
from orbit_tasks.archive.format import manifest as fm
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.format.expectation import ChainExpectation, VerifyReport
from orbit_tasks.archive.jobs import (
    ErrorCode,
    Job,
    JobFailure,
)
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import jobs as store
from orbit_tasks.archive.store import source
from orbit_tasks.archive.wakeups import Publisher, publish_wakeup
from orbit_tasks.db.engine import DB_CLOCK, Clock, single_statements
from orbit_tasks.db.faults import driver_code, is_transient_db
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.errors import InvalidInput, LeaseLost, ReaderLost
from orbit_tasks.ids import from_hex
from orbit_tasks.logs import log_action
from orbit_tasks.platform.history import history_kind
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
    CHAINED = "chained"  # internal: a confirm that took the next claim in the same statement


#: How the runner's chain checks decode batch lines: the first and the last line of every
#: file (with every file's SHA-256, gzip CRC, header and line count). Every byte of a file is
#: covered by its verified SHA-256 and was encoded by this runner; re-parsing every line cost
#: two thirds of a worker's CPU (docs/archive-jobs.md). ``orbit job verify`` parses them all.
CHAIN_LINES = "ends"


def parse_volumes(raw: str | None) -> dict[str, Path]:
    """``ORBIT_ARCHIVE_VOLUMES`` = JSON object ``{storage_hex: absolute_path}``."""
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        raise InvalidInput("ORBIT_ARCHIVE_VOLUMES is not a JSON object") from None
    if not isinstance(doc, dict):
        raise InvalidInput("ORBIT_ARCHIVE_VOLUMES is not a JSON object")
    return {from_hex(str(k), "storage id").hex(): Path(str(v)) for k, v in doc.items()}


@dataclass
class _Chain:
    """What a claim chain carries from one claim to the next (never re-read)."""

    engine: Engine
    conn: Connection  # the chain's one connection for its claims and confirms
    claim: store.Claim
    volume: Path
    directory: Path
    settings: Settings
    clock: Clock
    deadline: float  # monotonic end of the time slice
    rng: ArchiveRange | None = None  # derived once per chain
    cursor: source.Cursor | None = None  # (settled, id) of the tail's last root
    tail_final: bool = False  # the confirmed tail says nothing follows
    identity_stamp: tuple[int, int, int, int] | None = None  # stat of the verified identity


def run_job(
    ns_hex: str,
    job_hex: str,
    volumes: Mapping[str, Path],
    settings: Settings,
    *,
    engine: Engine | None = None,
    publish: Publisher | None = None,
    clock: Clock = DB_CLOCK,
) -> Outcome:
    """Handle one wake-up. Returns an outcome word (for logs and tests): ``missing``,
    ``not_mounted``, ``not_claimed``, ``succeeded``, ``failed``, ``released``, ``lease_lost``,
    ``transient``."""
    if engine is None:
        engine = platform_engine()
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
            c = store.claim(conn, ns_id, job_id, settings.archive_lease_seconds, clock=clock)
            if c is None:
                log_action(log, "archive.job.not_claimed", namespace_id=ns_hex, job_id=job_hex)
                return Outcome.NOT_CLAIMED
            log_action(
                log,
                "archive.job.takeover" if c.takeover else "archive.job.claimed",
                namespace_id=ns_id,
                job_id=job_id,
                attempts=c.job.attempts,
                batches=c.job.batches,
            )
            failpoints.hit("archive.after_claim")
            ch = _Chain(
                engine, conn, c, Path(volume), job_dir(Path(volume), ns_id, job_id), settings,
                clock, time.monotonic() + settings.archive_slice_seconds,
            )  # fmt: skip
            if c.takeover and is_stalled(
                c.job.attempts, c.job.batches, settings.archive_max_stalls
            ):
                return _fail(ch, ErrorCode.STALLED)
            return _run_chain(ch, publish)
    except Exception as exc:
        if is_transient_db(exc) or isinstance(exc, ReaderLost):
            log_action(
                log, "archive.job.transient", logging.WARNING, namespace_id=ns_hex,
                job_id=job_hex, error=type(exc).__name__, code=driver_code(exc),
            )  # fmt: skip
            return Outcome.TRANSIENT
        raise


def _run_chain(ch: _Chain, publish: Publisher | None) -> Outcome:
    try:
        outcome = _claims(ch)
    except JobFailure as failure:
        return _fail(ch, failure.code)
    except LeaseLost:
        _lost(ch.claim)
        return Outcome.LEASE_LOST
    if outcome is Outcome.RELEASED:
        job = ch.claim.job
        log_action(log, "archive.job.released", namespace_id=job.namespace_id, job_id=job.id)
        _publish_continuation(ch, publish)
    return outcome


def _publish_continuation(ch: _Chain, publish: Publisher | None) -> None:
    job = ch.claim.job
    if publish is None:
        publish = publish_wakeup
    try:
        publish(job.storage_id, job.namespace_id, job.id, kind=job.kind)
    except Exception as exc:  # broker down: the next tick's sweep finds the PENDING job
        log_action(
            log, "archive.job.wakeup_failed", logging.WARNING, job_id=job.id,
            error=type(exc).__name__,
        )  # fmt: skip


def _fail(ch: _Chain, code: ErrorCode) -> Outcome:
    c = ch.claim
    try:
        store.fail(ch.conn, c, code, clock=ch.clock)
    except LeaseLost:
        _lost(c)
        return Outcome.LEASE_LOST
    log_action(
        log, "archive.job.failed", logging.WARNING, namespace_id=c.job.namespace_id,
        job_id=c.job.id, error_code=code.value, batches=c.job.batches,
    )  # fmt: skip
    return Outcome.FAILED


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
        with ch.conn.begin():
            ch.rng = store.job_range(ch.conn, ch.claim.job)  # once per chain (POLICY_MISSING)
        _verify_prefix(ch)  # step 2
        if not ch.claim.job.has_manifest:  # step 3: the manifest fixes range and roots_total
            data, total = manifest_file(ch.conn, ch.claim.job, ch.rng)
            sha = fv.sha256_hex(data)
            manifest = _File(file_names.manifest_name(sha), sha, data, 0, total == 0, False)
            _refuse(_admit(ch, manifest, ch.claim.job.bytes))
            stored = store_job_file(ch.directory, manifest.name, manifest.data)
            _written(ch, manifest)
            outcome = _confirm(ch, manifest, stored, None)
            if outcome is not Outcome.CHAINED:
                return outcome
        if ch.tail_final:
            return _finish(ch)
        return _batches(ch)
    except fv.SourceInvalid:
        raise JobFailure(ErrorCode.SOURCE_INVALID) from None
    except DiskFull:
        raise JobFailure(ErrorCode.DISK_FULL) from None
    except ArchiveIOError:
        raise JobFailure(ErrorCode.IO_ERROR) from None


@dataclass(frozen=True)
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
    return _File(p.name, p.sha256, p.data, p.roots, p.final, True, p.seq, p.prev_sha256)


def _batches(ch: _Chain) -> Outcome:
    """Steps 3-4 for each batch. The read-ahead thread prepares the files; a writer thread
    writes file n+1 durably while file n's confirm is in flight (write-ahead by one file: if the
    lease is lost, it is a leftover beyond the prefix, removed by step 6 or the next owner).
    Every error of file n+1 (step 1, budget, the write itself) takes effect only after file n
    is confirmed, as if the files were handled one after the other."""
    job = ch.claim.job
    assert ch.rng is not None
    with (
        open_read_ahead(
            ch.settings.archive_reader, ch.engine, job, ch.rng, ch.cursor, file_cap(job.max_bytes)
        ) as ahead,
        ThreadPoolExecutor(1, thread_name_prefix="archive-write") as writer,
    ):
        upcoming: PreparedBatch | None | NotReady = ahead.next()
        writing: Future[StoredFile] | None = None
        while True:
            if upcoming is NOT_READY:
                upcoming = ahead.next()
            if upcoming is None:  # the source ran out before a final batch: the final step
                return _finish(ch)  # tells SOURCE_CHANGED
            job = ch.claim.job
            current = _batch_file(upcoming)
            # the thread builds on the chain this claim extends (it started from our tail)
            assert (current.seq, current.prev_sha256) == (job.batches + 1, job.last_sha256)
            if writing is None:  # not written ahead: step 1, budget and the write now
                _refuse(_admit(ch, current, job.bytes))
                writing = writer.submit(store_job_file, ch.directory, current.name, current.data)
            stored = writing.result()
            _written(ch, current)
            writing, upcoming = None, NOT_READY
            if not current.final and time.monotonic() < ch.deadline:
                upcoming = ahead.ready()  # write the next file ahead only if it is ready
                if upcoming is not NOT_READY:
                    follow = _batch_file(upcoming)
                    if _admit(ch, follow, job.bytes + len(current.data)) is None:
                        writing = writer.submit(
                            store_job_file, ch.directory, follow.name, follow.data
                        )  # else: refused again, after this confirm, in the next round
            outcome = _confirm(ch, current, stored, writing)
            if outcome is not Outcome.CHAINED:
                return outcome


def _check_volume(ch: _Chain) -> None:
    """Step 1: the mounted volume is the job's storage (checked on every claim: a disk swapped
    under a running worker is caught before anything is written). The identity file is read
    again whenever its ``stat`` changes (another disk mounted there has another device and
    inode; a rewritten file another inode or mtime); a claim whose ``stat`` matches the one
    already verified in this chain costs one ``stat``."""
    try:
        st = os.stat(ch.volume / IDENTITY_FILE)
    except OSError:
        raise JobFailure(ErrorCode.STORAGE_MISMATCH) from None
    stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if stamp == ch.identity_stamp:
        return
    try:
        ident = read_identity(ch.volume)
    except InvalidInput:
        raise JobFailure(ErrorCode.STORAGE_MISMATCH) from None
    if ident.storage_id != ch.claim.job.storage_id:
        raise JobFailure(ErrorCode.STORAGE_MISMATCH)
    ch.identity_stamp = stamp


def _expectation(ch: _Chain, c: store.Claim | None = None) -> ChainExpectation:
    assert ch.rng is not None
    expect = claim_rules.chain_expectation((c or ch.claim).job, complete=False)
    return replace(expect, range=(ch.rng.from_, ch.rng.until))


def _verify_prefix(ch: _Chain) -> None:
    """Step 2. After a claim from PENDING: the tail file only (the chain before it was verified
    when it was confirmed; leftovers wait for the final step). After a takeover: the whole
    confirmed chain, then the dead claims' leftovers go -- but only under a live lease (a claim
    paused past its lease must not take the new owner's files for leftovers)."""
    job = ch.claim.job
    if not ch.claim.takeover:
        if job.has_manifest:
            tail = verify.verify_job_prefix(
                ch.directory, _expectation(ch), io_errors=True, lines=CHAIN_LINES
            )
            _require_verified(tail, ch)
            _carry_tail(ch, tail)
        return
    names = leftovers.list_dir(ch.directory)
    report: VerifyReport | None = None
    if job.has_manifest:
        report = verify.verify_job_prefix(
            ch.directory, _expectation(ch), full=True, names=names, allow_strays=True,
            io_errors=True, lines=CHAIN_LINES,
        )  # fmt: skip
        _require_verified(report, ch)
        _carry_tail(ch, report)
    leftovers.remove(
        ch.conn, ch.claim, ch.clock, ch.directory, claim_rules.stray_names(names, report)
    )


def _carry_tail(ch: _Chain, report: VerifyReport) -> None:
    """The verified tail: the cursor after its last root, and whether anything follows (a
    final batch, or the manifest of a range without roots)."""
    ch.cursor = report.cursor
    ch.tail_final = report.final or (report.batches == 0 and report.roots_total == 0)


def manifest_file(conn: Connection, job: Job, rng: ArchiveRange) -> tuple[bytes, int]:
    """Step 3 for a job without a confirmed manifest: its bytes and ``roots_total``."""
    with conn.begin():
        total = source.count_roots(conn, job.kind, job.namespace_id, rng)
    data = fm.build_manifest(
        namespace_id=job.namespace_id,
        job_id=job.id,
        kind=job.kind,
        plan_revision=job.plan_revision,
        policy_revision=job.policy_revision,
        storage_id=job.storage_id,
        batch_size=job.batch_size,
        range_from=rng.from_,
        range_until=rng.until,
        roots_total=total,
        source=fm.source_descriptor(history_kind(job.kind)),
        created_at=job.created_at,
    )
    return data, total


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
    ch: _Chain, f: _File, stored: StoredFile, follow: Future[StoredFile] | None
) -> Outcome:
    """Step 4 after the durable write: the fenced confirm that chains the next claim (or keeps
    the lease for the final step, or releases the job at the end of the time slice). Returns
    ``chained``, or the outcome of the final step / ``released``. ``follow`` is the write of
    the next file, already under way (only when chaining)."""
    c = ch.claim
    job = c.job
    after: store.After = "keep" if f.final else "chain"
    if not f.final and follow is None and time.monotonic() >= ch.deadline:
        after = "release"
    try:
        nxt = store.confirm(
            ch.conn, c, is_batch=f.is_batch, roots=f.roots, size=len(f.data), sha256=f.sha256,
            after=after, lease_seconds=ch.settings.archive_lease_seconds, clock=ch.clock,
        )  # fmt: skip
    except LeaseLost:
        leftovers.remove_unless_confirmed(ch.conn, c, ch.directory, f.name, stored)
        if follow is not None:
            with contextlib.suppress(Exception):  # a failed write left nothing to remove
                ahead = follow.result()
                leftovers.remove_unless_confirmed(ch.conn, c, ch.directory, ahead.path.name, ahead)
        raise
    log_action(
        log, "archive.job.confirmed", namespace_id=job.namespace_id, job_id=job.id,
        file=f.name, batches=job.batches + (1 if f.is_batch else 0), roots=job.roots + f.roots,
        bytes=job.bytes + len(f.data), after=after,
    )  # fmt: skip
    failpoints.hit("archive.after_confirm")
    if after == "release":
        return Outcome.RELEASED
    assert nxt is not None
    ch.claim = nxt
    if after == "keep":
        ch.tail_final = True
        return _finish(ch)
    return Outcome.CHAINED


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
    stopped at a corrupt file would take the confirmed files after it for leftovers."""
    c = ch.claim
    job = c.job
    names = leftovers.list_dir(ch.directory)
    report = verify.verify_job_prefix(
        ch.directory, _expectation(ch), full=True, names=names, allow_strays=True,
        io_errors=True, lines=CHAIN_LINES,
    )  # fmt: skip
    _require_verified(report, ch)
    leftovers.remove(
        ch.conn, ch.claim, ch.clock, ch.directory, claim_rules.stray_names(names, report)
    )
    if claim_rules.source_changed(job.roots, report.roots_total, job.batches, report.final):
        raise JobFailure(ErrorCode.SOURCE_CHANGED)
    failpoints.hit("archive.before_finalize")
    store.finalize(ch.conn, c, clock=ch.clock)
    log_action(
        log, "archive.job.succeeded", namespace_id=job.namespace_id, job_id=job.id,
        attempts=job.attempts, batches=job.batches, roots=job.roots, bytes=job.bytes,
    )  # fmt: skip
    return Outcome.SUCCEEDED


def _loop(
    engine: Engine,
    c: store.Claim,
    volume: Path,
    settings: Settings,
    publish: Publisher | None,
    clock: Clock = DB_CLOCK,
) -> Outcome:
    """Run the claim chain of an existing claim ``c`` (tests: a claim taken elsewhere)."""
    with engine.connect() as conn:
        conn = single_statements(conn)
        ch = _Chain(
            engine, conn, c, volume, job_dir(volume, c.job.namespace_id, c.job.id), settings,
            clock, time.monotonic() + settings.archive_slice_seconds,
        )  # fmt: skip
        return _run_chain(ch, publish)
