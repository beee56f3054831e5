"""Verify a job directory on a volume against its job row, and export its decoded roots.

Used by ``orbit job verify`` / ``orbit job export`` and available to the runner
(:func:`verify_job_prefix` = SPEC §5 step 2 on a directory). Files are read one at a time, on
demand, so verification of a large job does not hold the whole chain in memory.

* :func:`verify_job_dir` -- the full check of :func:`fileformat.verify_chain`. ``.tmp-`` files are
  ignored; any other foreign name is reported as a bad file. A missing directory is fine only
  when nothing is confirmed yet (``last_sha256 == ""`` and not complete); otherwise the report
  names the directory.
* :func:`export_roots` -- verifies first (raises :class:`ChainInvalid` naming the first bad file),
  then yields ``{"root": {...}, "children": {...}}`` dicts in (settled, id) order, re-checking
  each file's hash while reading it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from orbit_tasks.archive.fileformat import (
    ChainExpectation,
    VerifyReport,
    decode_batch,
    parse_name,
    sha256_hex,
    verify_chain,
    verify_prefix,
)
from orbit_tasks.archive.volume import list_names, read_file
from orbit_tasks.errors import OrbitError


class ChainInvalid(OrbitError):
    """The job's files do not verify; ``report`` says which file and why."""

    def __init__(self, report: VerifyReport) -> None:
        super().__init__(
            f"archive chain does not verify: first bad file {report.first_bad_file} "
            f"({report.reason})"
        )
        self.report = report


def _missing_dir(dirpath: Path, expect: ChainExpectation) -> VerifyReport:
    nothing = expect.last_sha256 == "" and not expect.complete
    return VerifyReport(
        ok=nothing,
        first_bad_file=None if nothing else str(dirpath),
        reason=None if nothing else "job directory is missing",
        batches=0,
        roots=0,
        bytes=0,
        last_sha256="",
        final=False,
    )


def _loader(path: Path) -> Any:
    # Plain OSError (not ArchiveIOError): the chain check reports it as a bad file, by name.
    return path.read_bytes


def verify_job_dir(dirpath: Path, expect: ChainExpectation) -> VerifyReport:
    """Full verification of ``dirpath`` (``<volume>/<ns_hex>/<job_hex>``) against the job row."""
    directory = Path(dirpath)
    if not directory.is_dir():
        return _missing_dir(directory, expect)
    files = [(n, _loader(directory / n)) for n in list_names(directory)]
    return verify_chain(files, expect=expect)


def verify_job_prefix(
    dirpath: Path, expect: ChainExpectation, *, full: bool = False
) -> VerifyReport:
    """SPEC §5 step 2 on a directory: the tail file only, or (``full``) the whole confirmed
    prefix. Files beyond the prefix are ignored and listed in ``report.beyond``."""
    directory = Path(dirpath)
    expect = replace(expect, complete=False)
    if not directory.is_dir():
        return _missing_dir(directory, expect)
    names = list_names(directory)
    if full:
        return verify_prefix([(n, _loader(directory / n)) for n in names], expect=expect, full=True)
    return verify_prefix(
        [(n, _loader(directory / n)) for n in names if parse_name(n) is not None],
        expect=expect,
        full=False,
    )


def export_roots(dirpath: Path, expect: ChainExpectation) -> Iterator[dict[str, Any]]:
    """Verify, then yield the decoded root lines of the confirmed chain in order."""
    directory = Path(dirpath)
    report = verify_job_dir(directory, expect)
    if not report.ok:
        raise ChainInvalid(report)
    batches = sorted(
        (p.seq, n)
        for n in list_names(directory)
        if (p := parse_name(n)) is not None and 1 <= p.seq <= report.batches
    )
    for _seq, name in batches:
        try:
            data = read_file(directory / name)
        except FileNotFoundError:
            data = b""
        parsed = parse_name(name)
        if parsed is None or sha256_hex(data) != parsed.sha256:
            raise ChainInvalid(
                replace(report, ok=False, first_bad_file=name, reason="file changed during export")
            )
        yield from decode_batch(data).lines
