"""Export a settled window across jobs to one file (``orbit archive export``, issue 28 item 4):
JSON lines or Parquet, from the window reader (:mod:`window`: every file verified while it is
read). The file is written to a temp name beside ``PATH``, synced, then published under
``PATH`` -- by a hard link that fails when ``PATH`` exists (or a rename over it with ``force``)
-- and the directory synced: ``PATH`` never holds a half file, and a refused or failed export
leaves nothing behind.

* ``jsonl``: each root's line exactly as archived (the batch file's line, byte for byte:
  ``{"children":{TABLE:[ROW,...]},"root":{COLUMN:VALUE,...}}``, canonical JSON; ids and binary
  values hex, timestamps ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, JSON columns their stored text).
* ``parquet``: typed columns (:mod:`parquet`); every job of the window must describe its tables
  alike.
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from sqlalchemy import Engine

from orbit_tasks.archive.engine.storage import Storage
from orbit_tasks.archive.engine.volume import fsync_dir
from orbit_tasks.archive.format.lines import presorted_line
from orbit_tasks.archive.format.values import FormatError, format_ts
from orbit_tasks.archive.restore.run import ArchiveUnreadable, Window
from orbit_tasks.archive.restore.window import WindowRead, read_window, same_schemas
from orbit_tasks.errors import ConflictError, InvalidInput, OrbitError


class ExportFormat(enum.StrEnum):
    JSONL = "jsonl"
    PARQUET = "parquet"


PARQUET_EXTRA = "pip install 'orbit-tasks[parquet]'"


@dataclass(frozen=True)
class ExportResult:
    format: ExportFormat
    out: Path
    bytes: int
    read: WindowRead

    def to_dict(self) -> dict[str, Any]:
        w = self.read.window
        return {
            "ok": True,
            "format": self.format.value,
            "out": str(self.out),
            "bytes": self.bytes,
            "roots": self.read.roots,
            "window": {
                "from": None if w.from_ is None else format_ts(w.from_),
                "until": None if w.until is None else format_ts(w.until),
            },
            "jobs": [r.to_dict() for r in self.read.reads],
        }


def check_out(out: Path, force: bool) -> Path:
    """``out`` as an absolute path whose directory exists; :class:`InvalidInput` for a missing
    directory or a directory at ``out``, :class:`ConflictError` when ``out`` exists (unless
    ``force``)."""
    path = Path(os.path.abspath(out))
    if not path.parent.is_dir():
        raise InvalidInput(
            f"{{out}} {out}: the directory {path.parent} does not exist", fields=("out",)
        )
    if path.is_dir():
        raise InvalidInput(f"{{out}} {out} is a directory; give a file name", fields=("out",))
    if path.exists() and not force:
        raise ConflictError(
            f"{{out}} {out} exists; add {{force}} to replace it; nothing written",
            fields=("out", "force"),
        )
    return path


def parquet_writer() -> ModuleType:
    """The Parquet writer, or :class:`OrbitError` saying how to install the extra."""
    try:
        # Imported here: pyarrow is the optional extra (~0.3 s to import), loaded only by
        # `archive export --format parquet`.
        from orbit_tasks.archive.restore import parquet
    except ImportError:
        raise OrbitError(
            f"Parquet output needs pyarrow, which is not installed ({PARQUET_EXTRA}); "
            "nothing written"
        ) from None
    return parquet


@contextlib.contextmanager
def out_file(path: Path, force: bool) -> Iterator[IO[bytes]]:
    """A temp file beside ``path``, published under ``path`` once the block ends without an
    error (synced first), removed otherwise."""
    tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(6)}"
    fh = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb")
    try:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise ConflictError(
                    f"{{out}} {path} appeared while exporting; add {{force}} to replace it; "
                    "nothing written",
                    fields=("out", "force"),
                ) from None
            os.unlink(tmp)
        fsync_dir(path.parent)
    except BaseException:
        fh.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def export_window(
    platform: Engine,
    ns_id: bytes,
    ns_name: str,
    kind: str,
    window: Window,
    volumes: Mapping[bytes, Storage],
    fmt: ExportFormat,
    out: Path,
    *,
    force: bool = False,
) -> ExportResult:
    """Every root of the window across jobs into ``out`` (see the module docstring)."""
    path = check_out(out, force)
    parquet = parquet_writer() if fmt is ExportFormat.PARQUET else None
    read, roots = read_window(platform, ns_id, ns_name, kind, window, volumes)
    schema = same_schemas(read.jobs) if parquet is not None else None
    with out_file(path, force) as fh:
        if parquet is None:
            for r in roots:
                # decoded from canonical text, every object's keys come in sorted order: the
                # presorted encoder (orjson) gives the archived bytes back
                fh.write(presorted_line(r.line))
        else:
            assert schema is not None
            meta = {"namespace": ns_name, "kind": kind, **_window_doc(window)}
            writer = parquet.ParquetRoots(fh, schema, meta)
            try:
                for r in roots:
                    try:
                        writer.add(r.line)
                    except FormatError as exc:
                        where = f"{r.job.files.where.rstrip('/')}/{r.file}"
                        raise ArchiveUnreadable(r.job.job.id, where, exc.args[0]) from None
            except BaseException:
                writer.abandon()  # before the temp file is closed and removed
                raise
            writer.close()
        size = fh.tell()
    return ExportResult(fmt, path, size, read)


def _window_doc(window: Window) -> dict[str, str | None]:
    return {
        "settled_from": None if window.from_ is None else format_ts(window.from_),
        "settled_until": None if window.until is None else format_ts(window.until),
    }
