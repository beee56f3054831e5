"""Verify a job directory on a storage against its job row, and export its decoded roots.

The one streaming verifier: ``orbit job verify`` / ``orbit job export`` and the runner (the
prefix check of a claim, the stray cleanup and the final step, SPEC §5) all verify through it.
Files are read one at a time, on demand, so verification of a large job does not hold the
chain in memory. A job directory is a folder path or a :class:`~storage.JobFiles` (a folder or
an S3 prefix: the same checks, reading one object at a time).

* :func:`verify_job_dir` -- the full, strict check of :func:`chain.verify_chain`.
  ``.tmp-`` files are ignored; any other foreign name is reported as a bad file. A missing
  directory is fine only when nothing is confirmed yet (``last_sha256 == ""`` and not
  complete); otherwise the report names the directory.
* :func:`verify_job_prefix` -- SPEC §5 step 2 on a directory: the tail file only (opened by its
  name; the directory is not listed), or (``full``) the whole confirmed prefix. The runner
  passes ``allow_strays`` (other files at confirmed positions are reported, not fatal) and
  ``io_errors`` (an unreadable file other than a missing one raises ``ArchiveIOError``:
  ``IO_ERROR`` rather than ``CHAIN_BROKEN``).
* :func:`verify_job_part` -- the final step's walk in parts, resumable from a recorded progress
  (issue 24 item 4).
* :func:`confirmed_name_at` -- the name of the confirmed chain file at one position, walked
  back from the tail through the batch headers only.
* :func:`export_roots` -- verifies first (raises :class:`ChainInvalid` naming the first bad file),
  then yields ``{"root": {...}, "children": {...}}`` dicts in (settled, id) order, re-checking
  each file's hash while reading it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from orbit_tasks.archive.engine.storage import JobFiles, job_files
from orbit_tasks.archive.engine.volume import ArchiveIOError
from orbit_tasks.archive.format.batch import batch_header, decode_batch
from orbit_tasks.archive.format.chain import (
    ChainProgress,
    verify_chain,
    verify_chain_part,
    verify_prefix,
)
from orbit_tasks.archive.format.expectation import ChainExpectation, VerifyReport
from orbit_tasks.archive.format.names import TMP_PREFIX, parse_name, tail_name
from orbit_tasks.archive.format.values import FormatError, sha256_hex
from orbit_tasks.errors import OrbitError


class ChainInvalid(OrbitError):
    """The job's files do not verify; ``report`` says which file and why."""

    def __init__(self, report: VerifyReport) -> None:
        super().__init__(
            f"archive chain does not verify: first bad file {report.first_bad_file} "
            f"({report.reason})"
        )
        self.report = report


def _names(jf: JobFiles) -> list[str]:
    """Every name but ``.tmp-`` files, sorted (a missing directory lists as empty)."""
    return [n for n in jf.names() if not n.startswith(TMP_PREFIX)]


def _missing_dir(jf: JobFiles, expect: ChainExpectation) -> VerifyReport:
    nothing = expect.last_sha256 == "" and not expect.complete
    return VerifyReport(
        ok=nothing,
        first_bad_file=None if nothing else jf.where,
        reason=None if nothing else "job directory is missing",
        batches=0,
        roots=0,
        bytes=0,
        last_sha256="",
        final=False,
    )


def _loader(jf: JobFiles, name: str, io_errors: bool = False) -> Callable[[], bytes]:
    """Reads one file when the verifier gets to it. A missing file is reported as a bad file,
    by name; so is any other unreadable file, unless ``io_errors`` (then ``ArchiveIOError``:
    ``IO_ERROR`` rather than ``CHAIN_BROKEN`` in the runner)."""
    if io_errors:
        return lambda: jf.read(name)

    def load() -> bytes:
        try:
            return jf.read(name)
        except ArchiveIOError as exc:
            raise OSError(str(exc)) from None  # a bad file, by name

    return load


def verify_job_dir(dirpath: Path | JobFiles, expect: ChainExpectation) -> VerifyReport:
    """Full verification of a job directory (``<volume>/<ns_hex>/<job_hex>`` or its S3
    prefix) against the job row."""
    jf = job_files(dirpath)
    names = _names(jf)
    if not names and not jf.exists():
        return _missing_dir(jf, expect)
    files = [(n, _loader(jf, n)) for n in names]
    return verify_chain(files, expect=expect)


def verify_job_prefix(
    dirpath: Path | JobFiles,
    expect: ChainExpectation,
    *,
    full: bool = False,
    names: Sequence[str] | None = None,
    allow_strays: bool = False,
    io_errors: bool = False,
    lines: str = "all",
) -> VerifyReport:
    """SPEC §5 step 2 on a directory: the tail file only, or (``full``) the whole confirmed
    prefix; ``names`` is the directory's listing when the caller has it (full only). Files
    beyond the prefix are ignored and listed in ``report.beyond``."""
    jf = job_files(dirpath)
    expect = replace(expect, complete=False)
    if not full:
        if expect.last_sha256 == "":
            return verify_prefix([], expect=expect)
        tail = tail_name(expect.batches, expect.last_sha256)
        files = [(tail, _loader(jf, tail, io_errors))]
        return verify_prefix(files, expect=expect, lines=lines)
    if names is None:
        names = _names(jf)
        if not names and not jf.exists():
            return _missing_dir(jf, expect)
    files = [
        (n, _loader(jf, n, io_errors))
        for n in names
        if not allow_strays or parse_name(n) is not None
    ]
    return verify_prefix(files, expect=expect, full=True, allow_strays=allow_strays, lines=lines)


def verify_job_part(
    jf: JobFiles,
    expect: ChainExpectation,
    *,
    names: Sequence[str],
    progress: ChainProgress | None,
    more: Callable[[], bool],
    lines: str = "all",
) -> tuple[VerifyReport, ChainProgress | None]:
    """The runner's final step in parts (issue 24 item 4): :func:`verify_job_prefix` with
    ``full``, ``allow_strays`` and ``io_errors``, from ``progress`` for as long as ``more()``
    says (at least one file); returns the report and the progress to resume from (None: the
    walk ended)."""
    files = [(n, _loader(jf, n, True)) for n in names if parse_name(n) is not None]
    return verify_chain_part(
        files, expect=expect, progress=progress, more=more, allow_strays=True, lines=lines
    )


def confirmed_name_at(
    dirpath: Path | JobFiles, batches: int, last_sha256: str, seq: int
) -> str | None:
    """Name of the confirmed chain file at position ``seq`` (``0 <= seq <= batches``), walked back
    from the tail ``tail_name(batches, last_sha256)`` through each batch header's
    ``prev_sha256``; None when the walk cannot get there (a missing or unreadable file)."""
    if last_sha256 == "" or not 0 <= seq <= batches:
        return None
    jf = job_files(dirpath)
    name = tail_name(batches, last_sha256)
    for position in range(batches, seq, -1):
        try:
            prev = batch_header(jf.read(name))["prev_sha256"]
        except (OSError, FormatError, OrbitError):
            return None
        name = tail_name(position - 1, str(prev))
    return name


def export_roots(dirpath: Path | JobFiles, expect: ChainExpectation) -> Iterator[dict[str, Any]]:
    """Verify, then yield the decoded root lines of the confirmed chain in order."""
    jf = job_files(dirpath)
    report = verify_job_dir(jf, expect)
    if not report.ok:
        raise ChainInvalid(report)
    batches = sorted(
        (p.seq, n)
        for n in _names(jf)
        if (p := parse_name(n)) is not None and 1 <= p.seq <= report.batches
    )
    for _seq, name in batches:
        try:
            data = jf.read(name)
        except FileNotFoundError:
            data = b""
        parsed = parse_name(name)
        if parsed is None or sha256_hex(data) != parsed.sha256:
            raise ChainInvalid(
                replace(report, ok=False, first_bad_file=name, reason="file changed during export")
            )
        yield from decode_batch(data).lines
