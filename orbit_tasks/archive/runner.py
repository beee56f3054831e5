"""One Celery delivery of an archive job: claims, one confirmed file per claim (SPEC §5).

``run_job`` claims the job (PENDING, or RUNNING with an expired lease = takeover) and then loops:
verify the volume and the confirmed prefix, write the next file (manifest, then batches) durably,
confirm it with a fenced statement that chains the next claim, until the job is final (finalize)
or the time slice is over (release to PENDING + continuation wake-up). Any fenced write that
matches no row means the lease is lost: stop, write nothing more. Transient database faults are
never job failures: stop and let the lease expire (or the job was already released).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from orbit_tasks import failpoints
from orbit_tasks.archive import fileformat as ff
from orbit_tasks.archive import job_store as store
from orbit_tasks.archive import source
from orbit_tasks.archive.jobs import (
    ErrorCode,
    Job,
    JobFailure,
    JobState,
    file_cap,
    is_stalled,
    over_budget,
)
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.volume import (
    TMP_PREFIX,
    ArchiveIOError,
    DiskFull,
    job_dir,
    read_identity,
    remove_file_if_unconfirmed,
    store_job_file,
)
from orbit_tasks.archive.wakeups import Publisher
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.db.faults import driver_code, is_transient_db
from orbit_tasks.errors import InvalidInput, LeaseLost
from orbit_tasks.ids import from_hex
from orbit_tasks.logs import log_action
from orbit_tasks.platform.history import history_kind
from orbit_tasks.settings import Settings

log = logging.getLogger("orbit.archive.runner")


@dataclass(frozen=True)
class _Written:
    name: str
    data: bytes
    is_batch: bool
    roots: int
    final: bool  # nothing follows: finalize after the confirm


def parse_volumes(raw: str | None) -> dict[str, Path]:
    """``ORBIT_ARCHIVE_VOLUMES`` = JSON object ``{storage_hex: absolute_path}``."""
    import json

    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        raise InvalidInput("ORBIT_ARCHIVE_VOLUMES is not a JSON object") from None
    if not isinstance(doc, dict):
        raise InvalidInput("ORBIT_ARCHIVE_VOLUMES is not a JSON object")
    return {from_hex(str(k), "storage id").hex(): Path(str(v)) for k, v in doc.items()}


def run_job(
    ns_hex: str,
    job_hex: str,
    volumes: Mapping[str, Path],
    settings: Settings,
    *,
    engine: Engine | None = None,
    publish: Publisher | None = None,
    clock: Clock = DB_CLOCK,
) -> str:
    """Handle one wake-up. Returns an outcome word (for logs and tests): ``missing``,
    ``not_mounted``, ``not_claimed``, ``succeeded``, ``failed``, ``released``, ``lease_lost``,
    ``transient``."""
    if engine is None:
        from orbit_tasks.db.registry import platform_engine

        engine = platform_engine()
    ns_id, job_id = from_hex(ns_hex, "namespace id"), from_hex(job_hex, "job id")
    try:
        with engine.connect() as conn:
            job = store.get_job(conn, ns_id, job_id)
        if job is None:
            log_action(log, "archive.job.missing", namespace_id=ns_hex, job_id=job_hex)
            return "missing"
        volume = volumes.get(job.storage_id.hex())
        if volume is None:
            log_action(
                log,
                "archive.job.not_mounted",
                namespace_id=ns_hex,
                job_id=job_hex,
                storage_id=job.storage_id,
            )
            return "not_mounted"
        c = store.claim(engine, ns_id, job_id, settings.archive_lease_seconds, clock=clock)
        if c is None:
            log_action(log, "archive.job.not_claimed", namespace_id=ns_hex, job_id=job_hex)
            return "not_claimed"
        log_action(
            log,
            "archive.job.takeover" if c.takeover else "archive.job.claimed",
            namespace_id=ns_id,
            job_id=job_id,
            attempts=c.job.attempts,
            batches=c.job.batches,
        )
        failpoints.hit("archive.after_claim")
        if c.takeover and is_stalled(c.job.attempts, c.job.batches, settings.archive_max_stalls):
            return _fail(engine, c, ErrorCode.STALLED, clock)
        return _loop(engine, c, Path(volume), settings, publish, clock)
    except Exception as exc:
        if is_transient_db(exc):
            log_action(
                log,
                "archive.job.transient",
                logging.WARNING,
                namespace_id=ns_hex,
                job_id=job_hex,
                error=type(exc).__name__,
                code=driver_code(exc),
            )
            return "transient"
        raise


def _loop(
    engine: Engine,
    c: store.Claim,
    volume: Path,
    settings: Settings,
    publish: Publisher | None,
    clock: Clock = DB_CLOCK,
) -> str:
    deadline = time.monotonic() + settings.archive_slice_seconds
    full_verify = c.takeover
    while True:
        try:
            outcome, nxt = _one_claim(engine, c, volume, settings, full_verify, deadline, clock)
        except JobFailure as failure:
            return _fail(engine, c, failure.code, clock)
        except LeaseLost:
            _lost(c)
            return "lease_lost"
        if outcome == "chained":
            assert nxt is not None
            c, full_verify = nxt, False
            continue
        if outcome == "released":
            log_action(
                log,
                "archive.job.released",
                namespace_id=c.job.namespace_id,
                job_id=c.job.id,
            )
            _publish_continuation(c.job, publish)
        return outcome


def _publish_continuation(job: Job, publish: Publisher | None) -> None:
    if publish is None:
        from orbit_tasks.archive.wakeups import publish_wakeup

        publish = publish_wakeup
    try:
        publish(job.storage_id, job.namespace_id, job.id, kind=job.kind)
    except Exception as exc:  # broker down: the next tick's sweep finds the PENDING job
        log_action(
            log,
            "archive.job.wakeup_failed",
            logging.WARNING,
            job_id=job.id,
            error=type(exc).__name__,
        )


def _fail(engine: Engine, c: store.Claim, code: ErrorCode, clock: Clock) -> str:
    try:
        store.fail(engine, c, code, clock=clock)
    except LeaseLost:
        _lost(c)
        return "lease_lost"
    log_action(
        log,
        "archive.job.failed",
        logging.WARNING,
        namespace_id=c.job.namespace_id,
        job_id=c.job.id,
        error_code=code.value,
        batches=c.job.batches,
    )
    return "failed"


def _lost(c: store.Claim) -> None:
    log_action(
        log,
        "archive.job.lease_lost",
        logging.WARNING,
        namespace_id=c.job.namespace_id,
        job_id=c.job.id,
    )


# --- one claim ----------------------------------------------------------------------------------


def _one_claim(
    engine: Engine,
    c: store.Claim,
    volume: Path,
    settings: Settings,
    full_verify: bool,
    deadline: float,
    clock: Clock,
) -> tuple[str, store.Claim | None]:
    job = c.job
    try:
        # Step 1: the mounted volume is the job's storage.
        try:
            ident = read_identity(volume)
        except InvalidInput:
            raise JobFailure(ErrorCode.STORAGE_MISMATCH) from None
        if ident.storage_id != job.storage_id:
            raise JobFailure(ErrorCode.STORAGE_MISMATCH)
        directory = job_dir(volume, job.namespace_id, job.id)
        # Step 2: the confirmed prefix; leftovers of dead claims go.
        tail = _verify_prefix(
            directory, job, full_verify, lambda: store.check_lease(engine, c, clock=clock)
        )
        with engine.connect() as conn:
            rng = store.job_range(conn, job)
            written = None if tail.final else _next_file(conn, job, rng, tail.cursor)
        if written is None:  # the confirmed tail is final (or an empty range after the manifest)
            return _finish(engine, c, directory, clock)
        # Step 4: budget, durable write, then the fenced confirm.
        if over_budget(job.bytes, len(written.data), job.max_bytes):
            raise JobFailure(ErrorCode.BUDGET_EXCEEDED)
        stored = store_job_file(directory, written.name, written.data)
    except ff.SourceInvalid:
        raise JobFailure(ErrorCode.SOURCE_INVALID) from None
    except DiskFull:
        raise JobFailure(ErrorCode.DISK_FULL) from None
    except ArchiveIOError:
        raise JobFailure(ErrorCode.IO_ERROR) from None
    log_action(
        log,
        "archive.job.file_written",
        namespace_id=job.namespace_id,
        job_id=job.id,
        file=written.name,
        size=len(written.data),
        roots=written.roots,
    )
    failpoints.hit("archive.after_file_write")
    if written.final:
        after: store.After = "keep"
    elif time.monotonic() >= deadline:
        after = "release"
    else:
        after = "chain"
    try:
        nxt = store.confirm(
            engine,
            c,
            is_batch=written.is_batch,
            roots=written.roots,
            size=len(written.data),
            sha256=ff.sha256_hex(written.data),
            after=after,
            lease_seconds=settings.archive_lease_seconds,
            clock=clock,
        )
    except LeaseLost:
        _remove_unless_confirmed(engine, c, directory, written.name, stored)
        raise
    log_action(
        log,
        "archive.job.confirmed",
        namespace_id=job.namespace_id,
        job_id=job.id,
        file=written.name,
        batches=job.batches + (1 if written.is_batch else 0),
        roots=job.roots + written.roots,
        bytes=job.bytes + len(written.data),
        after=after,
    )
    failpoints.hit("archive.after_confirm")
    if after == "keep":
        assert nxt is not None
        return _finish(engine, nxt, directory, clock)
    if after == "release":
        return "released", None
    return "chained", nxt


@dataclass(frozen=True)
class _Tail:
    final: bool
    cursor: Any  # (settled, id) after which the next batch starts, or None


def _listdir(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except OSError:
        raise JobFailure(ErrorCode.IO_ERROR) from None


def _read(directory: Path, name: str) -> bytes:
    return (directory / name).read_bytes()


def _unlink(directory: Path, name: str) -> None:
    try:
        (directory / name).unlink()
    except FileNotFoundError:
        pass
    except OSError:  # read-only remount, EIO, EACCES...: never a raw exception with its path
        raise JobFailure(ErrorCode.IO_ERROR) from None


def _verify_prefix(directory: Path, job: Job, full: bool, still_mine: Callable[[], None]) -> _Tail:
    """Step 2. ``still_mine`` raises LeaseLost when the claim is no longer ours; it runs right
    before anything is removed (a stale claim's view of the prefix is out of date)."""
    names = _listdir(directory)
    try:
        if not job.has_manifest:
            # Nothing is confirmed yet: everything in the directory is a leftover.
            still_mine()
            for name in names:
                if name.startswith(TMP_PREFIX) or ff.parse_name(name) is not None:
                    _unlink(directory, name)
            return _Tail(False, None)
        expect = store.chain_expectation(job, complete=False)
        if full:
            files = [(n, _read(directory, n)) for n in names if ff.parse_name(n) is not None]
            chain = _chain_names(dict(files), job)
            report = ff.verify_prefix(
                [(n, d) for n, d in files if n in chain], expect=expect, full=True
            )
        else:
            tail = ff.tail_name(job.batches, job.last_sha256)
            files = [(tail, _read(directory, tail))] if tail in names else []
            report = ff.verify_prefix(files, expect=expect, full=False)
            chain = {tail}
    except (FileNotFoundError, ff.FormatError):
        raise JobFailure(ErrorCode.CHAIN_BROKEN) from None
    except OSError:
        raise JobFailure(ErrorCode.IO_ERROR) from None
    _require_verified(report, job)
    still_mine()
    for name in names:  # leftovers: temp files, files beyond the prefix, stray duplicates
        parsed = ff.parse_name(name)
        stray = parsed is not None and (
            parsed.seq > job.batches or (name not in chain and (full or parsed.seq == job.batches))
        )
        if stray or name.startswith(TMP_PREFIX):
            _unlink(directory, name)
    return _Tail(report.final, report.cursor)


def _chain_names(files: Mapping[str, bytes], job: Job) -> set[str]:
    """Names of the confirmed chain, walked back from the tail through ``prev_sha256``."""
    names: set[str] = set()
    seq, sha = job.batches, job.last_sha256
    while True:
        name = ff.tail_name(seq, sha)
        names.add(name)
        data = files.get(name)
        if seq == 0 or data is None:
            return names
        try:
            sha = ff.decode_batch(data).header["prev_sha256"]
        except ff.FormatError:
            return names
        seq -= 1


def _next_file(conn: Any, job: Job, rng: ArchiveRange, cursor: Any) -> _Written | None:
    """Step 3: the manifest, or the next batch; None when nothing follows the confirmed tail."""
    hk = history_kind(job.kind)
    if not job.has_manifest:
        total = source.count_roots(conn, job.kind, job.namespace_id, rng)
        data = ff.build_manifest(
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
            source=ff.source_descriptor(hk),
            created_at=job.created_at,
        )
        return _Written(ff.manifest_name(ff.sha256_hex(data)), data, False, 0, total == 0)
    page = source.read_roots_after(conn, job.kind, job.namespace_id, rng, cursor, job.batch_size)
    if not page.records:
        return None
    records, final = list(page.records), not page.has_more
    cap = file_cap(job.max_bytes)
    while True:
        data = ff.build_batch(
            job_id=job.id,
            seq=job.batches + 1,
            prev_sha256=job.last_sha256,
            records=records,
            settled_column=hk.settled_column,
            final=final,
        )
        if len(data) <= cap:
            break
        if len(records) == 1:
            raise JobFailure(ErrorCode.ROOT_TOO_LARGE)
        records, final = records[: len(records) // 2], False
    name = ff.batch_name(job.batches + 1, ff.sha256_hex(data))
    return _Written(name, data, True, len(records), final)


def _remove_unless_confirmed(
    engine: Engine, c: store.Claim, directory: Path, name: str, stored: Any
) -> None:
    """Step 6: our confirm was rejected; remove our file unless that very name is confirmed.

    Only a file this claim created is removed, and only its own inode (the new owner may have
    re-written the same name meanwhile)."""
    if not stored.created:
        return  # the name existed already with identical bytes: not ours to remove
    try:
        with engine.connect() as conn:
            now_job = store.get_job(conn, c.job.namespace_id, c.job.id)
        parsed = ff.parse_name(name)
        ahead = parsed is not None and (
            now_job is None or not now_job.has_manifest or parsed.seq > now_job.batches
        )
        if now_job is not None and now_job.state is JobState.RUNNING and ahead:
            # Another claim is live and has not confirmed this position yet: it may have found
            # our file under its name (identical bytes) and be about to confirm it. Its own
            # cleanup (next claim, or the final step) removes the file if it stays unconfirmed.
            return
        confirmed: set[str] = set()
        if now_job is not None and now_job.has_manifest:
            files = {}
            for n in _listdir(directory):
                if ff.parse_name(n) is not None:
                    files[n] = _read(directory, n)
            confirmed = _chain_names(files, now_job)
        remove_file_if_unconfirmed(directory, name, confirmed, inode=stored.inode)
    except Exception as exc:  # the next claim's prefix check removes leftovers beyond the prefix
        log_action(log, "archive.job.cleanup_skipped", logging.WARNING, error=type(exc).__name__)


def _require_verified(report: Any, job: Job) -> None:
    """A chain that does not verify fails the job with CHAIN_BROKEN (the log names the file)."""
    if not report.ok:
        log_action(
            log,
            "archive.job.chain_broken",
            logging.WARNING,
            job_id=job.id,
            file=report.first_bad_file,
        )
        raise JobFailure(ErrorCode.CHAIN_BROKEN)


def _finish(engine: Engine, c: store.Claim, directory: Path, clock: Clock) -> tuple[str, None]:
    """Step 5: re-verify the whole chain from disk, roots == roots_total, then SUCCEEDED."""
    job = c.job
    try:
        names = [n for n in _listdir(directory) if ff.parse_name(n) is not None]
        files = {n: _read(directory, n) for n in names}
    except FileNotFoundError:
        raise JobFailure(ErrorCode.CHAIN_BROKEN) from None
    except OSError:
        raise JobFailure(ErrorCode.IO_ERROR) from None
    chain = _chain_names(files, job)
    with engine.connect() as conn:
        rng = store.job_range(conn, job)
    # The manifest's range must still be the one any node derives from the database (as
    # `orbit job verify` checks), so a SUCCEEDED job never fails a later verify.
    expect = replace(store.chain_expectation(job, complete=False), range=(rng.from_, rng.until))
    report = ff.verify_chain([(n, d) for n, d in files.items() if n in chain], expect=expect)
    _require_verified(report, job)
    # Only a verified chain tells confirmed files from strays: a walk that stopped at a corrupt
    # file would take the confirmed files before it for leftovers.
    store.check_lease(engine, c, clock=clock)
    for n in names:
        if n not in chain:
            _unlink(directory, n)  # stray leftovers of dead claims, never a confirmed file
    manifest = ff.decode_manifest(files[ff.tail_name(0, _manifest_sha(files, chain))])
    if job.roots != manifest["roots_total"] or (job.batches > 0 and not report.final):
        raise JobFailure(ErrorCode.SOURCE_CHANGED)
    failpoints.hit("archive.before_finalize")
    store.finalize(engine, c, clock=clock)
    log_action(
        log,
        "archive.job.succeeded",
        namespace_id=job.namespace_id,
        job_id=job.id,
        attempts=job.attempts,
        batches=job.batches,
        roots=job.roots,
        bytes=job.bytes,
    )
    return "succeeded", None


def _manifest_sha(files: Mapping[str, bytes], chain: set[str]) -> str:
    for n in chain:
        parsed = ff.parse_name(n)
        if parsed is not None and parsed.is_manifest:
            return parsed.sha256
    raise JobFailure(ErrorCode.CHAIN_BROKEN)
