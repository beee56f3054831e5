"""The id index of a SUCCEEDED job and the lookup through it (issue 28 item 1, ``orbit archive
find|index``, docs/archive-format.md "The id index").

* :func:`build_index` streams the job's confirmed files once, verifying the whole chain as it
  goes (the verifier of ``orbit job verify``), and collects each root id with its batch and
  line; then writes the shards and the top to ``<ns_hex>/<job_hex>.index/`` beside the job's
  directory (never into it: a SUCCEEDED job directory holds exactly its chain) and records the
  top's SHA-256 by compare-and-set on the job row (``store/indexes.py``).
* :func:`find_in_job` answers from three reads: the top (its hash is the database's; its file
  list ends at the job row's ``last_sha256`` and counts its ``batches``), the id's shard (its
  hash is in its name, its name in the top) and the batch file (its SHA-256 is its name, its
  header's ``prev_sha256`` is the previous name in the top, its line holds the root).
* :func:`find_root` searches the SUCCEEDED jobs of a (namespace, kind): a job whose top has no
  shard for the id's first byte costs one read, otherwise two, and the job holding the id one
  more (a root id is in one job at most: the root table's key is (namespace, id) and job ranges
  do not overlap).

A file that does not hash to its name, a top that does not hash to the database's value or does
not match its job row, a shard that does not match the top: the lookup refuses (exit 1) naming
the file instead of answering.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from sqlalchemy import Engine

from orbit_tasks.archive.claims import chain_expectation, with_range
from orbit_tasks.archive.engine import volume
from orbit_tasks.archive.engine.objects import S3Storage
from orbit_tasks.archive.engine.storage import FolderStorage, JobFiles, Storage
from orbit_tasks.archive.engine.verify import ChainInvalid
from orbit_tasks.archive.engine.volume import ArchiveIOError, StoredFile
from orbit_tasks.archive.format import index as fmt
from orbit_tasks.archive.format.batch import decode_batch
from orbit_tasks.archive.format.chain import verify_chain
from orbit_tasks.archive.format.expectation import ChainExpectation, VerifyReport
from orbit_tasks.archive.format.gzip_member import GzipRefused, gunzip_member
from orbit_tasks.archive.format.names import TMP_PREFIX, parse_name
from orbit_tasks.archive.format.values import FormatError, sha256_hex
from orbit_tasks.archive.jobs import Job, JobFailure, JobState
from orbit_tasks.archive.store import indexes as index_store
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store.indexes import IndexRow
from orbit_tasks.errors import IllegalState, OrbitError
from orbit_tasks.logs import log_action
from orbit_tasks.platform.history import history_kind

__all__ = ["ArchiveDamaged", "ChainInvalid", "build_index", "find_in_job", "find_root"]

log = logging.getLogger("orbit.archive.engine.index")


class ArchiveDamaged(OrbitError):
    """A file of the archive (a chain file or an index file) is not what its proof says: the
    lookup refuses to answer (exit 1). ``file`` names it."""

    def __init__(self, file: str, where: str, reason: str) -> None:
        super().__init__(f"{file} ({where}): {reason}; refusing to answer from it")
        self.file = file
        self.reason = reason


class IndexFiles(Protocol):
    """The directory of a job's index: ``<ns_hex>/<job_hex>.index/`` on its storage."""

    @property
    def where(self) -> str: ...

    def read(self, name: str) -> bytes: ...

    def store(self, name: str, data: bytes) -> StoredFile: ...


class FolderIndexFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def where(self) -> str:
        return str(self.directory)

    def read(self, name: str) -> bytes:
        return volume.read_file(self.directory / name)

    def store(self, name: str, data: bytes) -> StoredFile:
        return volume.store_named_file(self.directory, name, data)


def index_files(storage: Storage, namespace_id: bytes, job_id: bytes) -> IndexFiles:
    """Where a job's index lives on ``storage`` (a folder or an S3 prefix)."""
    relative = f"{namespace_id.hex()}/{job_id.hex()}{fmt.INDEX_DIR_SUFFIX}"
    if isinstance(storage, FolderStorage):
        return FolderIndexFiles(storage.root / relative)
    if isinstance(storage, S3Storage):
        return storage.named_files(relative)
    raise TypeError(f"no index files on {type(storage).__name__}")


@dataclass
class Reads:
    """Files read by one lookup (what `orbit archive find` reports and the bench measures)."""

    names: list[str] = field(default_factory=list)

    def read(self, files: JobFiles | IndexFiles, name: str) -> bytes:
        self.names.append(name)
        try:
            return files.read(name)
        except FileNotFoundError:
            raise ArchiveDamaged(name, files.where, "the file is missing") from None
        except ArchiveIOError as exc:
            raise ArchiveDamaged(name, files.where, f"the file cannot be read ({exc})") from None


# --------------------------------------------------------------------------- build


@dataclass(frozen=True)
class Built:
    job_id: bytes
    row: IndexRow
    written: bool  # False: the index was recorded and its files intact already


def expectation_of(engine: Engine, job: Job) -> ChainExpectation:
    """The complete chain a SUCCEEDED job's row vouches for, with its range from the database."""
    expect = chain_expectation(job, complete=True)
    with engine.connect() as conn:
        try:
            return with_range(expect, job_store.job_range(conn, job))
        except JobFailure:
            return expect


def _intact(storage: Storage, job: Job, index: IndexRow) -> bool:
    """Are the recorded index's files all there with their bytes (the top by the database's
    hash, each shard by its name)? If not, the build writes the missing ones again (the same
    bytes: the index is deterministic)."""
    files = index_files(storage, job.namespace_id, job.id)
    try:
        top = fmt.parse_top(files.read(fmt.top_name(index.index_sha256)), index.index_sha256)
        for name, _entries in top.shards.values():
            if sha256_hex(files.read(name)) != name[-68:-4]:
                return False
    except (FileNotFoundError, ArchiveIOError, FormatError):
        return False
    return True


def build_index(engine: Engine, storage: Storage, job: Job) -> Built:
    """Verify the job's whole chain while reading it once, then write and record its index.
    A job already indexed is left as it is when its index files are intact; missing ones are
    written again. Refused: a job that is not SUCCEEDED (exit 3), a
    chain that does not verify (:class:`ChainInvalid`, exit 1 naming the file)."""
    if job.state is not JobState.SUCCEEDED:
        raise IllegalState(
            f"job {job.id.hex()} is {job.state.value}; only SUCCEEDED jobs are indexed"
        )
    with engine.connect() as conn:
        existing = index_store.get_index(conn, job.namespace_id, job.id)
    if existing is not None and _intact(storage, job, existing):
        return Built(job.id, existing, False)
    jf = storage.job(job.namespace_id, job.id)
    shards: dict[int, list[bytes]] = {}
    spans: dict[int, fmt.BatchSpan] = {}

    def capture(name: str, data: bytes) -> None:
        parsed = parse_name(name)
        if parsed is None or parsed.is_manifest or sha256_hex(data) != parsed.sha256:
            return  # not a batch, or a damaged one: the verifier names it
        try:
            payload = gunzip_member(data)
        except GzipRefused:
            return  # the verifier names the file
        lines = payload.split(b"\n")
        header = orjson.loads(lines[0])
        spans[parsed.seq] = fmt.BatchSpan(
            name, int(header["roots"]), tuple(header["first"]), tuple(header["last"])
        )
        for n, line in enumerate(lines[1:-1], start=1):
            try:
                root = orjson.loads(line)["root"]
                rid = bytes.fromhex(root["id"])
                ok = len(rid) == 16 and root["namespace_id"] == job.namespace_id.hex()
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                ok = False
            if not ok:
                raise ChainInvalid(bad_line(name, n))
            shards.setdefault(rid[0], []).append(fmt.ENTRY.pack(rid, parsed.seq, n))

    def bad_line(name: str, n: int) -> VerifyReport:
        return VerifyReport(
            ok=False, first_bad_file=name, reason=f"root line {n} has no root id of the job",
            batches=0, roots=0, bytes=0, last_sha256="", final=False,
        )  # fmt: skip

    def loader(name: str) -> Callable[[], bytes]:
        def load() -> bytes:
            try:
                data = jf.read(name)
            except ArchiveIOError as exc:
                raise OSError(str(exc)) from None  # a bad file, by name
            capture(name, data)
            return data

        return load

    names = [n for n in jf.names() if not n.startswith(TMP_PREFIX)]
    # The checks of the runner's final step: every byte by its SHA-256 and the gzip CRC, the
    # links, both ends of each batch; every root line is parsed here for its id anyway.
    files_ = [(n, loader(n)) for n in names]
    report = verify_chain(files_, expect=expectation_of(engine, job), lines="ends")
    if not report.ok:
        raise ChainInvalid(report)
    files = index_files(storage, job.namespace_id, job.id)
    written: dict[int, tuple[str, int]] = {}
    for shard in sorted(shards):
        records = shards[shard]
        name, data = fmt.build_shard(job.id, shard, records)
        files.store(name, data)
        written[shard] = (name, len(records))
    manifest = next(n for n in names if (p := parse_name(n)) is not None and p.is_manifest)
    top, data = fmt.build_top(
        namespace_id=job.namespace_id, job_id=job.id, kind=job.kind, storage_id=job.storage_id,
        manifest=manifest, spans=[spans[s] for s in sorted(spans)], shards=written,
    )  # fmt: skip
    files.store(top, data)
    row, recorded = index_store.record_index(
        engine, job, index_sha256=sha256_hex(data), batches=job.batches,
        roots=sum(len(r) for r in shards.values()), shards=len(written),
    )  # fmt: skip
    log_action(
        log, "archive.index.built", namespace_id=job.namespace_id, job_id=job.id,
        index_sha256=row.index_sha256, roots=row.roots, shards=row.shards, recorded=recorded,
    )  # fmt: skip
    return Built(job.id, row, True)


# --------------------------------------------------------------------------- lookup


@dataclass(frozen=True)
class Found:
    """A root found, with its proof."""

    job: Job
    index: IndexRow
    top: fmt.Top
    seq: int
    line_no: int
    file_name: str
    where: str  # the job directory
    line: bytes  # the root's line exactly as archived (without its newline)
    header: dict[str, Any]


def _check_top(top: fmt.Top, job: Job, index: IndexRow, where: str) -> None:
    want = {
        "namespace_id": (top.namespace_id, job.namespace_id.hex()),
        "job_id": (top.job_id, job.id.hex()),
        "kind": (top.kind, job.kind),
        "storage_id": (top.storage_id, job.storage_id.hex()),
        "batches": (top.batches, job.batches),
        "roots": (top.roots, job.roots),
        "last_sha256": (top.last_sha256, job.last_sha256),
    }
    for key, (have, expected) in want.items():
        if have != expected:
            raise ArchiveDamaged(top.name, where, f"the index's {key} differs from the job row")
    if index.last_sha256 != job.last_sha256:
        raise ArchiveDamaged(top.name, where, "the index was recorded for another chain tail")


def find_in_job(
    storage: Storage, job: Job, index: IndexRow, root_id: bytes, reads: Reads
) -> Found | None:
    """The root ``root_id`` in ``job`` through its index, or None when the job does not hold it."""
    files = index_files(storage, job.namespace_id, job.id)
    name = fmt.top_name(index.index_sha256)
    try:
        top = fmt.parse_top(reads.read(files, name), index.index_sha256)
    except fmt.IndexInvalid as exc:
        raise ArchiveDamaged(name, files.where, exc.args[0].split(": ", 1)[-1]) from None
    _check_top(top, job, index, files.where)
    shard = fmt.shard_of(root_id)
    if shard not in top.shards:
        return None
    shard_file, entries = top.shards[shard]
    try:
        entry = fmt.find_in_shard(
            shard_file, reads.read(files, shard_file), job_id=top.job_id, shard=shard,
            entries=entries, root_id=root_id,
        )  # fmt: skip
    except fmt.IndexInvalid as exc:
        raise ArchiveDamaged(shard_file, files.where, exc.args[0].split(": ", 1)[-1]) from None
    if entry is None:
        return None
    if not 1 <= entry.seq <= top.batches:
        raise ArchiveDamaged(shard_file, files.where, "an entry names a batch the job lacks")
    jf = storage.job(job.namespace_id, job.id)
    batch = top.file_name(entry.seq)
    data = reads.read(jf, batch)
    if sha256_hex(data) != top.link(entry.seq):
        raise ArchiveDamaged(batch, jf.where, "contents do not hash to the sha256 in the name")
    try:
        decoded = decode_batch(data, settled_column=history_kind(job.kind).settled_column)
    except FormatError as exc:
        raise ArchiveDamaged(batch, jf.where, exc.args[0]) from None
    header = decoded.header
    try:
        span = top.span(entry.seq)
    except fmt.IndexInvalid as exc:
        raise ArchiveDamaged(top.name, files.where, exc.args[0].split(": ", 1)[-1]) from None
    checks = [
        (header["job_id"] == job.id.hex(), "its job_id is not the job's"),
        (header["seq"] == entry.seq, "its header seq differs from its name"),
        (header["prev_sha256"] == top.link(entry.seq - 1),
         "its prev_sha256 is not the previous link"),
        (header["roots"] == span.roots, "its roots differ from the index"),
        (tuple(header["first"]) == span.first and tuple(header["last"]) == span.last,
         "its first/last keys differ from the index"),
        (header["final"] == (entry.seq == top.batches),
         "its final flag is not its place in the chain"),
        (0 < entry.line <= header["roots"], "the index names a line the file lacks"),
    ]  # fmt: skip
    for ok, reason in checks:
        if not ok:
            raise ArchiveDamaged(batch, jf.where, reason)
    raw = gunzip_member(data).split(b"\n")[entry.line]
    if decoded.lines[entry.line - 1]["root"].get("id") != root_id.hex():
        raise ArchiveDamaged(top.name, files.where, "the index names a line of another root")
    return Found(job, index, top, entry.seq, entry.line, batch, jf.where, raw, header)


@dataclass
class Search:
    """What a search over the SUCCEEDED jobs of a (namespace, kind) found and what it read."""

    found: Found | None = None
    jobs_searched: int = 0
    unindexed: list[Job] = field(default_factory=list)
    reads: Reads = field(default_factory=Reads)


def indexed_jobs(engine: Engine, ns_id: bytes, kind: str) -> list[tuple[Job, IndexRow | None]]:
    with engine.connect() as conn:
        return list(index_store.succeeded_with_indexes(conn, ns_id, kind))


def find_root(
    jobs: list[tuple[Job, IndexRow | None]],
    storage_of: Callable[[Job], Storage],
    root_id: bytes,
) -> Search:
    """Search the indexed jobs (newest first: support questions are mostly about recent
    history) for ``root_id``; stops at the first job holding it."""
    search = Search()
    for job, index in reversed(jobs):
        if index is None:
            search.unindexed.append(job)
            continue
        search.jobs_searched += 1
        found = find_in_job(storage_of(job), job, index, root_id, search.reads)
        if found is not None:
            search.found = found
            return search
    return search


def unindexed(jobs: list[tuple[Job, IndexRow | None]]) -> Iterator[Job]:
    return (job for job, index in jobs if index is None)
