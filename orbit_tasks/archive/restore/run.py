"""Restore archived jobs into a database: ``orbit job restore`` and ``orbit archive restore``
(docs/archive-format.md, "Restore").

Order of work, so that a bad archive writes nothing:

1. every job's chain is verified against its job row (:func:`verify.verify_job_dir`, the check
   of ``orbit job verify``), then every row of every batch is decoded against the manifest's
   table description (format 2) or today's tables (format 1): :func:`open_job`,
   :func:`check_rows`;
2. the target tables are made from the description when missing, else checked;
3. each batch file is one target transaction: the rows already present are read by key; a row
   present with identical values is skipped, one present with other values is a conflict (the
   whole batch is then left unwritten), the others are inserted. Files are re-hashed and
   re-linked while read, so a file changed after the verification stops the restore.

A window (``--from``/``--until``) filters roots by their settled column, ``from <= settled <
until``, with their children; jobs are whole files, the window is applied row by row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.exc import IntegrityError

from orbit_tasks.archive import claims
from orbit_tasks.archive.engine.storage import JobFiles, Place, job_files, open_storage
from orbit_tasks.archive.engine.verify import ChainInvalid, verify_job_dir
from orbit_tasks.archive.format.batch import DecodedBatch, decode_batch
from orbit_tasks.archive.format.manifest import decode_manifest
from orbit_tasks.archive.format.names import parse_name
from orbit_tasks.archive.format.tables import (
    SourceSchema,
    TableSpec,
    schema_of,
)
from orbit_tasks.archive.format.values import FormatError, format_ts, sha256_hex
from orbit_tasks.archive.jobs import Job, JobFailure, JobState
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.restore import store
from orbit_tasks.archive.restore.rows import (
    decode_row,
    differing_columns,
    key_json,
    primary_key_of,
)
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.errors import IllegalState, InvalidInput, OrbitError
from orbit_tasks.platform.history import HistoryKind, history_kind

WRITE_TRIES = 3  # a concurrent writer inserting the same key between our read and our insert


class ArchiveUnreadable(OrbitError):
    """A verified archive that cannot be decoded for a restore (or changed while read)."""

    def __init__(self, job_id: bytes, name: str, reason: str) -> None:
        super().__init__(f"job {job_id.hex()}: {name}: {reason}")


@dataclass(frozen=True)
class Window:
    """``from <= settled < until`` (either side open when None)."""

    from_: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.from_ is not None and self.until is not None and self.from_ >= self.until:
            raise InvalidInput(
                f"{{from_}} {format_ts(self.from_)} must be before {{until}} "
                f"{format_ts(self.until)}",
                fields=("from_", "until"),
            )

    def contains(self, ts: datetime) -> bool:
        return (self.from_ is None or ts >= self.from_) and (self.until is None or ts < self.until)

    def meets(self, rng: ArchiveRange) -> bool:
        """Whether a job's range holds any settled time inside the window."""
        if rng.empty:
            return False
        # a key end (until, id) holds roots settled at ``until`` itself
        last = rng.until + timedelta(microseconds=1) if rng.until_id is not None else rng.until
        after_start = self.from_ is None or last > self.from_
        before_end = self.until is None or rng.from_ is None or rng.from_ < self.until
        return after_start and before_end


EVERYTHING = Window()


def uncovered(window: Window, ranges: Sequence[ArchiveRange]) -> list[tuple[Any, Any]]:
    """Parts of the window that no range covers, as (from, until) pairs (None = open), e.g. the
    end of a month not archived yet. An open ``until`` leaves no uncovered tail. Pure."""
    lo_w, hi_w = window.from_ or datetime.min, window.until or datetime.max
    cursor, gaps = lo_w, []
    for lo, hi in sorted((r.from_ or datetime.min, r.until) for r in ranges if not r.empty):
        if lo >= hi_w:
            break
        if lo > cursor:
            gaps.append((cursor, lo))
        cursor = max(cursor, hi)
    if window.until is not None and cursor < hi_w:
        gaps.append((cursor, hi_w))
    return [(None if a == datetime.min else a, None if b == datetime.max else b) for a, b in gaps]


def jobs_in_window(
    conn: Connection, ns_id: bytes, kind: str, window: Window
) -> list[tuple[Job, ArchiveRange]]:
    """SUCCEEDED jobs of (namespace, kind) whose range meets the window, in range order.

    A job's ``until`` lies before its ``created_at`` (``archive_after`` >= 0), so jobs created
    before the window's start cannot meet it; ``from`` never decreases from one job to the next
    (it is the greatest ``until`` of the successes before), so the scan stops at the first job
    that starts after the window."""
    chosen = []
    for job in store.succeeded_jobs(conn, ns_id, kind, window.from_):
        try:
            rng = job_store.job_range(conn, job)
        except JobFailure:
            raise OrbitError(
                f"job {job.id.hex()}: its policy revision row is missing, so its range is unknown"
            ) from None
        if window.until is not None and rng.from_ is not None and rng.from_ >= window.until:
            break
        if window.meets(rng):
            chosen.append((job, rng))
    return chosen


# --------------------------------------------------------------------------- reading archives


@dataclass(frozen=True)
class JobArchive:
    """A SUCCEEDED job whose chain verified: its manifest, table description and files."""

    job: Job
    directory: JobFiles  # a folder or an S3 prefix, read one file at a time
    range: ArchiveRange | None
    manifest: dict[str, Any]
    schema: SourceSchema
    manifest_file: str
    batch_files: tuple[str, ...]  # seq 1..N

    @property
    def format(self) -> str:
        return str(self.manifest["format"])


def job_directory(volumes: Mapping[bytes, Place], job: Job) -> JobFiles:
    """The job's directory on the one given volume (a folder or S3 storage) that holds its
    storage."""
    volume = volumes.get(job.storage_id)
    if volume is None:
        given = ", ".join(sorted(s.hex() for s in volumes)) or "none"
        raise InvalidInput(
            f"job {job.id.hex()} belongs to storage {job.storage_id.hex()}, "
            f"but {{volumes}} gives storage {given}",
            fields=("volumes",),
        )
    return open_storage(volume).job(job.namespace_id, job.id)


def open_job(platform: Engine, job: Job, place: Path | JobFiles) -> JobArchive:
    """Verify the whole chain against the job row (as ``orbit job verify``); raises
    :class:`ChainInvalid` naming the first bad file, :class:`IllegalState` unless SUCCEEDED."""
    if job.state is not JobState.SUCCEEDED:
        raise IllegalState(
            f"job {job.id.hex()} is {job.state.value}: only SUCCEEDED jobs are restored "
            "(their chain is complete)"
        )
    rng: ArchiveRange | None
    with platform.connect() as conn:
        try:
            rng = job_store.job_range(conn, job)
        except JobFailure:
            rng = None  # policy row gone: verify without the range check, as `job verify`
    expect = claims.chain_expectation(job, complete=True)
    if rng is not None:
        expect = claims.with_range(expect, rng)
    directory = job_files(place)
    report = verify_job_dir(directory, expect)
    if not report.ok:
        raise ChainInvalid(report)
    named = sorted((p.seq, n) for n in directory.names() if (p := parse_name(n)) is not None)
    manifest_file = named[0][1]
    data = _read(job, directory, manifest_file)
    try:
        manifest = decode_manifest(data)
        schema = schema_of(manifest)
        check_kind_tables(schema, history_kind(job.kind))
    except FormatError as exc:
        raise ArchiveUnreadable(job.id, manifest_file, exc.args[0]) from None
    return JobArchive(
        job, directory, rng, manifest, schema, manifest_file, tuple(n for _, n in named[1:])
    )


def check_kind_tables(schema: SourceSchema, kind: HistoryKind) -> None:
    """A restore writes only the tables of the job's history kind: the manifest's root table is
    the kind's root table, each child table one of its child tables (an archive written before a
    child table existed has fewer). :class:`FormatError` names the table and the allowed ones."""
    children = [c.table.name for c in kind.children]
    foreign = [f"child table {spec.name}" for spec, _ in schema.children
               if spec.name not in children]  # fmt: skip
    if schema.root.name != kind.root.name:
        foreign.insert(0, f"root table {schema.root.name}")
    if foreign:
        bad = foreign[0]
        allowed = ", ".join([kind.root.name, *children])
        raise FormatError(
            f"the manifest names the {bad}, which is not a table of kind {kind.name!r} "
            f"(allowed: {allowed}); nothing written"
        )


CHANGED = "file changed after the chain was verified"


def _sha_of(name: str) -> str:
    parsed = parse_name(name)
    assert parsed is not None, name  # only names of the verified chain get here
    return parsed.sha256


def _read(job: Job, directory: JobFiles, name: str) -> bytes:
    try:
        data = directory.read(name)
    except (OSError, OrbitError):
        raise ArchiveUnreadable(job.id, name, "file cannot be read") from None
    if sha256_hex(data) != _sha_of(name):
        raise ArchiveUnreadable(job.id, name, CHANGED)
    return data


def read_batches(archive: JobArchive) -> Iterator[tuple[int, str, DecodedBatch]]:
    """The batch files in order, each re-hashed and re-linked to its predecessor."""
    link = _sha_of(archive.manifest_file)
    for seq, name in enumerate(archive.batch_files, start=1):
        data = _read(archive.job, archive.directory, name)
        try:
            batch = decode_batch(data, settled_column=archive.schema.settled_column)
        except FormatError:
            raise ArchiveUnreadable(archive.job.id, name, CHANGED) from None
        if batch.header["seq"] != seq or batch.header["prev_sha256"] != link:
            raise ArchiveUnreadable(archive.job.id, name, CHANGED)
        link = _sha_of(name)
        yield seq, name, batch


@dataclass
class BatchRows:
    """Decoded rows of one batch inside the window: (table spec, link column, rows) per table,
    the root first."""

    roots: int
    tables: list[tuple[TableSpec, str, list[dict[str, Any]]]]


def batch_rows(archive: JobArchive, batch: DecodedBatch, window: Window) -> BatchRows:
    """Decode every line of a batch (raises :class:`FormatError`) and keep the window's roots."""
    schema = archive.schema
    root_rows: list[dict[str, Any]] = []
    kids: dict[str, list[dict[str, Any]]] = {spec.name: [] for spec, _ in schema.children}
    for line in batch.lines:
        root = decode_row(schema.root, line["root"])
        inside = window.contains(root[schema.settled_column])
        if inside:
            root_rows.append(root)
        for spec, _parent in schema.children:
            rows = [decode_row(spec, r) for r in line["children"].get(spec.name, [])]
            if inside:
                kids[spec.name].extend(rows)
    tables = [(schema.root, "id", root_rows)]
    tables += [(spec, parent, kids[spec.name]) for spec, parent in schema.children]
    return BatchRows(len(root_rows), tables)


def check_rows(archive: JobArchive) -> None:
    """Decode every row of every batch before anything is written (format-2 descriptions that
    do not fit their rows, format-1 rows that today's tables cannot hold)."""
    for _seq, name, batch in read_batches(archive):
        try:
            batch_rows(archive, batch, EVERYTHING)
        except FormatError as exc:
            raise ArchiveUnreadable(archive.job.id, name, exc.args[0]) from None


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class Conflict:
    job_id: str
    seq: int
    table: str
    key: dict[str, Any]
    columns: tuple[str, ...]  # names only: values may be business content

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "seq": self.seq,
            "table": self.table,
            "key": self.key,
            "columns": list(self.columns),
        }


@dataclass
class BatchResult:
    job_id: str
    seq: int
    batches: int
    roots: int  # roots of this batch inside the window
    inserted: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    conflicts: list[Conflict] = field(default_factory=list)


@dataclass
class JobResult:
    job_id: str
    format: str
    range: dict[str, Any] | None
    batches: int = 0
    roots: int = 0
    inserted: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    conflicts: list[Conflict] = field(default_factory=list)

    def add(self, b: BatchResult) -> None:
        self.batches += 1
        self.roots += b.roots if not b.conflicts else 0
        self.inserted.update(b.inserted)
        self.skipped.update(b.skipped)
        self.conflicts.extend(b.conflicts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "format": self.format,
            "range": self.range,
            "batches": self.batches,
            "roots": self.roots,
            "inserted": dict(self.inserted),
            "skipped": dict(self.skipped),
            "conflicts": len(self.conflicts),
        }


def range_json(rng: ArchiveRange | None) -> dict[str, Any] | None:
    if rng is None:
        return None
    return {
        "from": None if rng.from_ is None else format_ts(rng.from_),
        "until": format_ts(rng.until),
    }


def restore_job(
    target: Engine,
    archive: JobArchive,
    window: Window = EVERYTHING,
    on_batch: Callable[[BatchResult], None] | None = None,
) -> JobResult:
    """Write the job's rows into ``target`` (tables made or checked first), one transaction per
    batch file. Conflicting batches are left unwritten and reported; the others are written."""
    tables = store.prepare_tables(target, archive.schema)
    result = JobResult(archive.job.id.hex(), archive.format, range_json(archive.range))
    total = len(archive.batch_files)
    for seq, name, batch in read_batches(archive):
        try:
            rows = batch_rows(archive, batch, window)
        except FormatError as exc:
            raise ArchiveUnreadable(archive.job.id, name, exc.args[0]) from None
        outcome = _write_batch(target, tables, archive.job, seq, total, rows)
        result.add(outcome)
        if on_batch is not None:
            on_batch(outcome)
    return result


def _write_batch(
    target: Engine, tables: Mapping[str, Table], job: Job, seq: int, total: int, rows: BatchRows
) -> BatchResult:
    for attempt in range(WRITE_TRIES):
        try:
            return _write_once(target, tables, job, seq, total, rows)
        except IntegrityError:
            if attempt == WRITE_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _write_once(
    target: Engine, tables: Mapping[str, Table], job: Job, seq: int, total: int, rows: BatchRows
) -> BatchResult:
    out = BatchResult(job.id.hex(), seq, total, rows.roots)
    with target.begin() as conn:
        pending: list[tuple[Table, list[dict[str, Any]]]] = []
        for spec, link, wanted in rows.tables:
            table = tables[spec.name]
            keys = sorted({r[link] for r in wanted})
            found = store.existing_rows(conn, table, spec, job.namespace_id, link, keys)
            new = []
            for row in wanted:
                present = found.get(primary_key_of(spec, row))
                if present is None:
                    new.append(row)
                    continue
                differ = differing_columns(spec, row, present)
                if differ:
                    key = key_json(spec, row)
                    out.conflicts.append(Conflict(out.job_id, seq, spec.name, key, tuple(differ)))
                else:
                    out.skipped[spec.name] += 1
            pending.append((table, new))
        if out.conflicts:
            out.skipped.clear()
            return out  # nothing of this batch is written (only reads happened)
        for table, new in pending:
            store.insert_rows(conn, table, new)
            if new:
                out.inserted[table.name] += len(new)
    return out
