"""Repair from the source (issue 24 item 3): a job's missing or corrupt files rebuilt from the
rows they were made of, and kept only when they are the originals (``orbit job repair``).

The files are deterministic: the runner's own read and builder path (the manifest of
:func:`budget.manifest_bytes`, the batches of :class:`readahead.ReadAhead`) builds the same
bytes from the same rows. The chain proves it: a rebuilt file is kept only when the link the
chain records above it -- the next good file's ``prev_sha256``, or the job row's
``last_sha256`` for the tail -- is the SHA-256 of what was rebuilt; each batch header carries the
SHA-256 of the file before it, so a match at the top proves every rebuilt file below it.

How (docs/archive-jobs.md "Repair from the source"):

1. walk back from the tail (the job row's ``last_sha256``) through the batch headers, reading
   each file, down to the highest damaged position ``m`` (missing, or not hashing to its name);
2. rebuild files ``0..m`` from the source (the manifest's ``roots_total`` counted again; the
   batches from the start of the range), comparing each with what the storage holds;
3. if the rebuilt file ``m`` hashes to the link above it, put back every damaged file among
   ``0..m`` (durably: a folder's temp file, ``fsync``, ``link`` or ``rename``, directory
   ``fsync``; on S3 the conditional PUT, known stored); else nothing is written and the
   damaged file is named: the source changed since (rows purged, changed or added).

Nothing else is touched: a good file is never rewritten, files beyond the chain stay.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace

from sqlalchemy import Engine

from orbit_tasks.archive.claims import file_cap
from orbit_tasks.archive.engine.budget import manifest_bytes, manifest_file
from orbit_tasks.archive.engine.readahead import ReadAhead
from orbit_tasks.archive.engine.storage import JobFiles
from orbit_tasks.archive.format.batch import batch_header
from orbit_tasks.archive.format.names import manifest_name, tail_name
from orbit_tasks.archive.format.values import FormatError, sha256_hex
from orbit_tasks.archive.jobs import Job, JobFailure
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.logs import log_action

log = logging.getLogger("orbit.archive.engine.repair")

MISSING, CORRUPT = "missing", "corrupt"
REBUILT, WOULD_REBUILD, NOT_REBUILT = "rebuilt", "would_rebuild", "not_rebuilt"


@dataclass(frozen=True)
class RepairedFile:
    """One damaged chain file: what was found and what the repair did."""

    seq: int
    name: str
    found: str  # missing | corrupt
    action: str  # rebuilt | would_rebuild | not_rebuilt

    def as_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "name": self.name, "found": self.found, "action": self.action}


@dataclass(frozen=True)
class RepairReport:
    files: list[RepairedFile]
    checked: int  # chain files read (the walk and the comparison)
    reason: str | None = None  # why the damaged files were not rebuilt (None: they were, or
    # there was nothing to do)

    @property
    def ok(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class _Damage:
    top: int  # the highest damaged position
    name: str  # its chain name
    found: str
    link: str  # the SHA-256 the chain records for it
    checked: int


class _Changed(Exception):
    """The source no longer builds the chain's files."""


def repair_job(
    directory: JobFiles, job: Job, rng: ArchiveRange, source_db: Engine, *, dry_run: bool
) -> RepairReport:
    """Rebuild ``job``'s damaged files in ``directory`` from ``source_db`` (see the module
    docstring); ``dry_run`` reads and proves everything and writes nothing."""
    if job.last_sha256 == "":
        return RepairReport([], 0)
    damage = _highest_damage(directory, job)
    if damage is None:
        return RepairReport([], job.batches + 1)
    reason = "the source builds other bytes (rows changed, added or purged since)"
    for manifest in _manifest_candidates(job, rng, source_db):
        try:
            damaged, checked = _rebuild(directory, job, rng, source_db, manifest, damage)
        except _Changed as exc:
            reason = str(exc)
            continue
        if damaged is None:
            continue  # this manifest does not lead to the chain's link: the next candidate
        action = WOULD_REBUILD if dry_run else REBUILT
        files = [RepairedFile(seq, name, found, action) for seq, name, found, _ in damaged]
        if not dry_run:
            for seq, name, _found, data in damaged:
                directory.replace_damaged(name, data)
                log_action(
                    log, "archive.job.file_repaired", namespace_id=job.namespace_id,
                    job_id=job.id, file=name, seq=seq,
                )  # fmt: skip
        return RepairReport(files, damage.checked + checked)
    bad = RepairedFile(damage.top, damage.name, damage.found, NOT_REBUILT)
    return RepairReport([bad], damage.checked, reason)


def _read(directory: JobFiles, name: str) -> bytes | None:
    try:
        return directory.read(name)
    except FileNotFoundError:
        return None


def _highest_damage(directory: JobFiles, job: Job) -> _Damage | None:
    """Step 1: the walk back from the tail through the headers, to the first damaged file."""
    link = job.last_sha256
    for seq in range(job.batches, -1, -1):
        name = tail_name(seq, link)
        data = _read(directory, name)
        if data is None or sha256_hex(data) != link:
            found = MISSING if data is None else CORRUPT
            return _Damage(seq, name, found, link, job.batches - seq + 1)
        if seq > 0:
            try:
                link = str(batch_header(data)["prev_sha256"])
            except (FormatError, KeyError):  # hashes to the chain's link: never happens
                return _Damage(seq, name, CORRUPT, link, job.batches - seq + 1)
    return None


def _manifest_candidates(job: Job, rng: ArchiveRange, source_db: Engine) -> Iterator[bytes]:
    """The manifest as the source builds it now (``roots_total`` counted again), then with the
    job's confirmed roots as its total (a finished job whose rows were purged since)."""
    with source_db.connect() as conn:
        data, total = manifest_file(conn, job, rng)
    yield data
    if total != job.roots:
        yield manifest_bytes(job, rng, job.roots)


def _rebuild(
    directory: JobFiles,
    job: Job,
    rng: ArchiveRange,
    source_db: Engine,
    manifest: bytes,
    damage: _Damage,
) -> tuple[list[tuple[int, str, str, bytes]] | None, int]:
    """Step 2: files ``0..damage.top`` rebuilt from ``manifest`` and the source; returns the
    damaged ones among them (seq, name, found, bytes) -- or None when the rebuilt top file does
    not hash to the chain's link -- and how many stored files it compared."""
    damaged: list[tuple[int, str, str, bytes]] = []
    for seq, name, data in _rebuilt_files(job, rng, source_db, manifest, damage.top):
        if seq == damage.top:  # positions 0..top-1 were compared with the storage
            if sha256_hex(data) != damage.link:
                return None, seq
            damaged.append((seq, name, damage.found, data))
            return damaged, seq
        stored = _read(directory, name)
        if stored != data:
            damaged.append((seq, name, MISSING if stored is None else CORRUPT, data))
    raise AssertionError("unreachable: the rebuild ends at the damaged top file")


def _rebuilt_files(
    job: Job, rng: ArchiveRange, source_db: Engine, manifest: bytes, top: int
) -> Iterator[tuple[int, str, bytes]]:
    """Files ``0..top`` as the runner builds them: the manifest, then the read-ahead from the
    start of the range (its reader and packer, the same encoder and cuts)."""
    sha = sha256_hex(manifest)
    yield 0, manifest_name(sha), manifest
    if top == 0:
        return
    start = replace(job, batches=0, last_sha256=sha)
    try:
        with ReadAhead(source_db, start, rng, None, file_cap(job.max_bytes)) as ahead:
            for seq in range(1, top + 1):
                batch = ahead.next()
                if batch is None:
                    raise _Changed(f"the source ran out of rows before file {seq}")
                yield batch.seq, batch.name, batch.data
    except JobFailure as failure:  # a value that no longer encodes, a root over the cap
        raise _Changed(f"the source no longer builds the files ({failure.code.value})") from None
