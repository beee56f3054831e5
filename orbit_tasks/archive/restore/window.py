"""The roots archived in a settled window across jobs (issue 28 items 1 and 4): ``orbit archive
roots`` and ``orbit archive export`` read through here.

The SUCCEEDED jobs of (namespace, kind) whose range meets the window are taken in range order
(:func:`run.jobs_in_window`, the platform tables). Of each job only the files whose header keys
overlap the window are decoded, each one verified as it is read:

1. the job directory is listed once: exactly one file per chain position ``0..batches`` (no
   foreign name; ``.tmp-`` files are ignored), the tail's name holding the row's
   ``last_sha256``; the manifest is checked against the job row and its range
   (:func:`chain.check_manifest`) and gives the table description;
2. the window's last file is found walking back from the tail through the batch headers: each
   file read hashes to its name and its ``prev_sha256`` names the listed file before it, so the
   walk is the confirmed chain down from the row's ``last_sha256``;
3. the window's first file is found by a binary search on the headers' ``last`` keys (each file
   probed hashes to its name);
4. the files from the first to the last are streamed, each with every check of a full walk
   (:func:`chain.check_batch`: SHA-256 = name, ``prev_sha256`` = the listed predecessor, seq,
   job, keys in the job range and increasing, namespace and children), and only the roots with
   ``from <= settled < until`` are yielded, in (settled, id) order across the jobs.

A bad file stops the reader with :class:`run.ArchiveUnreadable` naming the job and the file
(exit 1) before the root that made it bad is yielded; callers write their output to a temp name
and keep it only when the whole window was read.

Files before the window are not read (but for the binary search's probes); files after it are
read and hashed but not decoded (step 2). The window end costs nothing when it is open, and a
job inside the window is read once, file by file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from orbit_tasks.archive import claims
from orbit_tasks.archive.engine.storage import JobFiles, Storage
from orbit_tasks.archive.format.batch import batch_header
from orbit_tasks.archive.format.chain import check_batch, check_manifest
from orbit_tasks.archive.format.names import TMP_PREFIX, parse_name, tail_name
from orbit_tasks.archive.format.tables import SourceSchema, schema_of
from orbit_tasks.archive.format.values import FormatError, format_ts, sha256_hex
from orbit_tasks.archive.jobs import Job
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.restore.run import (
    ArchiveUnreadable,
    Window,
    check_kind_tables,
    jobs_in_window,
)
from orbit_tasks.errors import InvalidInput, NotFound, OrbitError
from orbit_tasks.platform.history import history_kind


def settled_window(settled_from: datetime | None, settled_until: datetime | None) -> Window:
    """``from <= settled < until`` (either side open when None); a reversed or empty window is
    :class:`InvalidInput` naming both values."""
    if settled_from is not None and settled_until is not None and settled_from >= settled_until:
        raise InvalidInput(
            f"{{settled_from}} {format_ts(settled_from)} must be before {{settled_until}} "
            f"{format_ts(settled_until)}",
            fields=("settled_from", "settled_until"),
        )
    return Window(settled_from, settled_until)


@dataclass(frozen=True)
class WindowJob:
    """A job of the window, opened: its files listed, its manifest checked."""

    job: Job
    range: ArchiveRange
    files: JobFiles
    names: tuple[str, ...]  # the chain's file names by position 0..batches
    manifest: dict[str, Any]
    schema: SourceSchema

    @property
    def format(self) -> str:
        return str(self.manifest["format"])


@dataclass(frozen=True)
class ArchivedRoot:
    """One root of the window: its line as archived (``{"root": {...}, "children": {...}}``,
    JSON values), where it was read, and its key (settled, id) as archived text."""

    job: WindowJob
    seq: int
    file: str
    line: dict[str, Any]
    key: tuple[str, str]

    @property
    def ref(self) -> dict[str, Any]:
        """Where the root is: what ``orbit archive roots`` lists."""
        return {
            "id": self.key[1],
            "settled": self.key[0],
            "job_id": self.job.job.id.hex(),
            "storage_id": self.job.job.storage_id.hex(),
            "seq": self.seq,
            "file": self.file,
        }


@dataclass
class JobRead:
    """What the reader read of one job."""

    job_id: str
    format: str
    files_read: int = 0  # every file read: manifest, probes, the walk back, the window's files
    files_decoded: int = 0
    roots: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "format": self.format,
            "files_read": self.files_read,
            "files_decoded": self.files_decoded,
            "roots": self.roots,
        }


@dataclass
class WindowRead:
    """The jobs of a window, opened, and what was read of them (filled while reading)."""

    window: Window
    jobs: list[WindowJob]
    reads: list[JobRead] = field(default_factory=list)

    @property
    def roots(self) -> int:
        return sum(r.roots for r in self.reads)


def select_jobs(
    platform: Engine,
    ns_id: bytes,
    ns_name: str,
    kind: str,
    window: Window,
    volumes: Mapping[bytes, Storage],
) -> list[tuple[Job, ArchiveRange, Storage]]:
    """The SUCCEEDED jobs of the window in range order with the storage that holds each.
    :class:`NotFound` when no job meets the window; :class:`InvalidInput` naming the storages
    that no given volume holds (nothing is read then)."""
    history_kind(kind)
    with platform.connect() as conn:
        selected = jobs_in_window(conn, ns_id, kind, window)
    if not selected:
        raise NotFound(
            f"no SUCCEEDED {kind} job of namespace {ns_name} covers the settled window "
            f"{window_text(window)}"
        )
    missing = sorted({j.storage_id.hex() for j, _ in selected if j.storage_id not in volumes})
    if missing:
        raise InvalidInput(
            f"jobs of the window are on storage {', '.join(missing)}, which no {{volumes}} "
            "gives; add a {volumes} for each",
            fields=("volumes",),
        )
    return [(j, rng, volumes[j.storage_id]) for j, rng in selected]


def window_text(window: Window) -> str:
    lo = "beginning" if window.from_ is None else format_ts(window.from_)
    hi = "now" if window.until is None else format_ts(window.until)
    return f"[{lo}, {hi})"


def open_job(job: Job, rng: ArchiveRange, storage: Storage, read: JobRead) -> WindowJob:
    """List the job's directory and check its manifest (steps 1 of the module docstring)."""
    files = storage.job(job.namespace_id, job.id)
    names = chain_names(job, files)
    data = _read(job, files, names[0], read)
    expect = claims.with_range(claims.chain_expectation(job, complete=True), rng)
    try:
        manifest = check_manifest(names[0], data, expect)
        schema = schema_of(manifest)
        check_kind_tables(schema, history_kind(job.kind))
    except FormatError as exc:
        raise ArchiveUnreadable(job.id, _where(files, names[0]), exc.args[0]) from None
    read.format = str(manifest["format"])
    return WindowJob(job, rng, files, names, manifest, schema)


def chain_names(job: Job, files: JobFiles) -> tuple[str, ...]:
    """The names of a SUCCEEDED job's files by position, from one listing: exactly one per
    position ``0..batches``, the tail's holding the row's ``last_sha256``, no other file."""
    by_seq: dict[int, str] = {}
    for name in files.names():
        if name.startswith(TMP_PREFIX):
            continue
        parsed = parse_name(name)
        if parsed is None:
            raise ArchiveUnreadable(job.id, _where(files, name), "not an orbit-archive file name")
        if parsed.seq > job.batches:
            raise ArchiveUnreadable(
                job.id, _where(files, name), "file beyond the confirmed chain of a finished job"
            )
        if parsed.seq in by_seq:
            raise ArchiveUnreadable(
                job.id,
                _where(files, name),
                f"second file for chain position {parsed.seq} (beside {by_seq[parsed.seq]})",
            )
        by_seq[parsed.seq] = name
    tail = tail_name(job.batches, job.last_sha256)
    for seq in range(job.batches + 1):
        if seq not in by_seq:
            missing = tail if seq == job.batches else f"{seq:08d}-*"
            raise ArchiveUnreadable(job.id, _where(files, missing), f"chain file {seq} is missing")
    if by_seq[job.batches] != tail:
        raise ArchiveUnreadable(
            job.id, _where(files, by_seq[job.batches]), "last link differs from the job row"
        )
    return tuple(by_seq[seq] for seq in range(job.batches + 1))


def _where(files: JobFiles, name: str) -> str:
    return f"{files.where.rstrip('/')}/{name}"


def _read(job: Job, files: JobFiles, name: str, read: JobRead) -> bytes:
    try:
        data = files.read(name)
    except FileNotFoundError:
        raise ArchiveUnreadable(job.id, _where(files, name), "file is missing") from None
    except (OSError, OrbitError):
        raise ArchiveUnreadable(job.id, _where(files, name), "file cannot be read") from None
    read.files_read += 1
    return data


def _sha(name: str) -> str:
    parsed = parse_name(name)
    assert parsed is not None, name  # names come from chain_names
    return parsed.sha256


class _Probe:
    """Header reads of one job's batch files, each checked to hash to its name; the bytes of
    the files the stream will decode are kept (a bounded few: the search's last probes)."""

    def __init__(self, wj: WindowJob, read: JobRead) -> None:
        self.wj, self.read = wj, read
        self.kept: dict[int, bytes] = {}

    def header(self, seq: int, keep: bool = False) -> dict[str, Any]:
        wj = self.wj
        name = wj.names[seq]
        data = self.kept.get(seq)
        if data is None:
            data = _read(wj.job, wj.files, name, self.read)
            if sha256_hex(data) != _sha(name):
                raise ArchiveUnreadable(
                    wj.job.id, _where(wj.files, name), "contents do not hash to their name"
                )
        try:
            header = batch_header(data)
        except FormatError as exc:
            raise ArchiveUnreadable(wj.job.id, _where(wj.files, name), exc.args[0]) from None
        for end in ("first", "last"):
            key = header[end]
            if not (
                isinstance(key, list) and len(key) == 2 and all(isinstance(k, str) for k in key)
            ):
                raise ArchiveUnreadable(
                    wj.job.id, _where(wj.files, name), f"batch header {end} bad"
                )
        if keep:
            self.kept[seq] = data
        return header

    def take(self, seq: int) -> bytes | None:
        return self.kept.pop(seq, None)


def _last_in_window(probe: _Probe, window: Window) -> int:
    """Step 2: the last position whose first key is before the window's end, walked back from
    the tail (each header's ``prev_sha256`` must name the listed file before it); 0 when none."""
    wj = probe.wj
    last = len(wj.names) - 1
    if window.until is None:
        return last
    until = format_ts(window.until)
    seq = last
    while seq >= 1:
        header = probe.header(seq, keep=True)
        if header["first"][0] < until:
            return seq
        probe.take(seq)
        if tail_name(seq - 1, str(header["prev_sha256"])) != wj.names[seq - 1]:
            raise ArchiveUnreadable(
                wj.job.id,
                _where(wj.files, wj.names[seq]),
                "batch prev_sha256 does not name the listed file before it",
            )
        seq -= 1
    return 0


def _first_in_window(probe: _Probe, window: Window, last: int) -> int:
    """Step 3: the first position ``<= last`` whose last key is at or after the window's start
    (binary search on the headers); ``last + 1`` when none."""
    if window.from_ is None or last == 0:
        return 1
    start = format_ts(window.from_)
    lo, hi = 1, last
    while lo < hi:
        mid = (lo + hi) // 2
        if probe.header(mid)["last"][0] >= start:
            hi = mid
        else:
            lo = mid + 1
    if probe.header(lo, keep=True)["last"][0] >= start:
        return lo
    probe.take(lo)
    return last + 1


def read_window(
    platform: Engine,
    ns_id: bytes,
    ns_name: str,
    kind: str,
    window: Window,
    volumes: Mapping[bytes, Storage],
) -> tuple[WindowRead, Iterator[ArchivedRoot]]:
    """Open every job of the window (its listing and manifest: a bad one raises here, before a
    root is read) and return them with the stream of the window's roots."""
    selected = select_jobs(platform, ns_id, ns_name, kind, window, volumes)
    result = WindowRead(window, [])
    for job, rng, storage in selected:
        read = JobRead(job.id.hex(), "")
        result.jobs.append(open_job(job, rng, storage, read))
        result.reads.append(read)
    return result, _stream(result)


def _stream(result: WindowRead) -> Iterator[ArchivedRoot]:
    window = result.window
    lo = None if window.from_ is None else format_ts(window.from_)
    hi = None if window.until is None else format_ts(window.until)
    previous: tuple[str, str] | None = None
    for wj, read in zip(result.jobs, result.reads, strict=True):
        for root in _job_roots(wj, read, window):
            key = root.key
            if (lo is not None and key[0] < lo) or (hi is not None and key[0] >= hi):
                continue
            if previous is not None and key <= previous:
                raise ArchiveUnreadable(
                    wj.job.id,
                    _where(wj.files, root.file),
                    "a root at or before the previous job's last root (the jobs' ranges overlap)",
                )
            previous = key
            read.roots += 1
            yield root


def _job_roots(wj: WindowJob, read: JobRead, window: Window) -> Iterator[ArchivedRoot]:
    """Steps 2 to 4 for one job: every root of the files that overlap the window."""
    probe = _Probe(wj, read)
    last = _last_in_window(probe, window)
    first = _first_in_window(probe, window, last)
    expect = claims.with_range(claims.chain_expectation(wj.job, complete=True), wj.range)
    settled = wj.schema.settled_column
    after: tuple[str, str] | None = None
    for seq in range(first, last + 1):
        name = wj.names[seq]
        data = probe.take(seq)
        if data is None:
            data = _read(wj.job, wj.files, name, read)
        try:
            batch = check_batch(
                seq, name, data, expect=expect, manifest=wj.manifest,
                link=_sha(wj.names[seq - 1]), after=after,
            )  # fmt: skip
        except FormatError as exc:
            raise ArchiveUnreadable(wj.job.id, _where(wj.files, name), exc.args[0]) from None
        read.files_decoded += 1
        after = (str(batch.header["last"][0]), str(batch.header["last"][1]))
        for line in batch.lines:
            root = line["root"]
            yield ArchivedRoot(wj, seq, name, line, (str(root[settled]), str(root["id"])))


def list_roots(
    platform: Engine,
    ns_id: bytes,
    ns_name: str,
    kind: str,
    window: Window,
    volumes: Mapping[bytes, Storage],
) -> tuple[WindowRead, Iterator[dict[str, Any]]]:
    """The roots archived in the window across jobs, each with where it is (``ref``): the
    listing of ``orbit archive roots`` (and of ``orbit archive find --settled-from/until``)."""
    result, roots = read_window(platform, ns_id, ns_name, kind, window, volumes)
    return result, (r.ref for r in roots)


def same_schemas(jobs: Sequence[WindowJob]) -> SourceSchema | None:
    """The one table description of every job (format 1 read through today's tables), or
    :class:`OrbitError` naming the first job whose description differs from the first's
    (a column added between them): a typed file has one schema."""
    if not jobs:
        return None
    first = jobs[0]
    for wj in jobs[1:]:
        if wj.schema.tables != first.schema.tables or (
            wj.schema.settled_column,
            [p for _, p in wj.schema.children],
        ) != (first.schema.settled_column, [p for _, p in first.schema.children]):
            raise OrbitError(
                f"job {wj.job.id.hex()} describes its tables otherwise than job "
                f"{first.job.id.hex()} (a column changed between them); export each part of "
                "the window on its own; nothing written"
            )
    return first.schema
