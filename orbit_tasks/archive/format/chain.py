"""Pure verification of an ``orbit-archive/1`` chain against its job row (SPEC §5 step 2/5, §6).

Use it through :mod:`orbit_tasks.archive.format.batch` (``verify_chain``, ``verify_prefix``,
``ChainExpectation``, ``VerifyReport``); file contents may be bytes or zero-argument loaders.

Verification API:

* :func:`verify_chain` (files, expect) checks the confirmed chain 0..``expect.batches`` in full.
  With ``expect.complete`` (job SUCCEEDED) any file beyond the chain is an error, the last batch
  must be final and the roots must add up to the manifest's ``roots_total``. Without it, files
  beyond the confirmed prefix are ignored and listed in ``VerifyReport.beyond``.
* :func:`verify_prefix` (files, expect, full=False) is the runner's step 2: with ``full=False``
  only the tail file (``tail_name(batches, last_sha256)``) is checked -- present, hashes to
  ``last_sha256``, decodes, seq/job match -- so the caller may pass just that one file. With
  ``full=True`` (after a takeover) it is :func:`verify_chain` with ``complete=False``.
* :func:`check_manifest` and :func:`check_batch` check one file with the checks of a full walk
  at its position (the link, the previous key and the manifest given), for a reader of part of a
  chain (``orbit archive export|roots``, :mod:`orbit_tasks.archive.restore.window`).
* Reports carry ``cursor`` = the (settled, id) of the last verified root (``None`` if none), the
  point after which the next batch starts. ``first_bad_file`` names the first bad file in chain
  order (a missing batch gets its exact name when its successor's header names it, else
  ``<seq>-*.jsonl.gz``); row totals that disagree with
  correct files name the tail file; ``roots_total`` disagreement names the manifest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orbit_tasks.archive.format.batch import (
    DecodedBatch,
    batch_cursor,
    batch_header,
    decode_batch,
)
from orbit_tasks.archive.format.expectation import ChainExpectation, VerifyReport
from orbit_tasks.archive.format.manifest import decode_manifest, range_doc, range_keys
from orbit_tasks.archive.format.names import ParsedName, parse_name, tail_name
from orbit_tasks.archive.format.values import FormatError, sha256_hex


class _Bad(Exception):
    def __init__(self, name: str | None, reason: str) -> None:
        super().__init__(reason)
        self.name = name
        self.reason = reason


FileData = bytes | Callable[[], bytes]
"""File contents, or a loader called when needed (so a verifier holds one file at a time)."""
_File = tuple[str, ParsedName, FileData]


def _load(data: FileData, name: str = "") -> bytes:
    """Contents of a file; a loader's ``OSError`` (vanished, unreadable) is a bad file."""
    try:
        return data() if callable(data) else data
    except OSError:
        raise _Bad(name, "file cannot be read (missing or unreadable)") from None


@dataclass
class _State:
    batches: int = 0
    roots: int = 0
    nbytes: int = 0
    link: str = ""
    final: bool = False
    last_key: tuple[str, str] | None = None
    manifest: dict[str, Any] | None = None
    manifest_name: str | None = None
    beyond: list[str] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)

    def report(self, bad: _Bad | None = None) -> VerifyReport:
        cursor = None
        if self.last_key is not None:
            cursor = batch_cursor({"last": list(self.last_key)})
        total = None if self.manifest is None else int(self.manifest["roots_total"])
        return VerifyReport(
            ok=bad is None,
            first_bad_file=None if bad is None else bad.name,
            reason=None if bad is None else bad.reason,
            batches=self.batches,
            roots=self.roots,
            bytes=self.nbytes,
            last_sha256=self.link,
            final=self.final,
            cursor=cursor,
            beyond=tuple(self.beyond),
            strays=tuple(self.strays),
            roots_total=total,
        )


def _missing_name(seq: int, groups: dict[int, list[_File]] | None = None) -> str:
    """Name of a missing file: exact when a successor's header names it, else a pattern."""
    for _, _, data in (groups or {}).get(seq + 1, []):
        try:
            prev = batch_header(_load(data))["prev_sha256"]
        except (FormatError, _Bad):
            continue
        return tail_name(seq, prev)
    return "00000000-*.json" if seq == 0 else f"{seq:08d}-*.jsonl.gz"


def _check_manifest(name: str, data: bytes, expect: ChainExpectation) -> dict[str, Any]:
    try:
        doc = decode_manifest(data)
    except FormatError as exc:
        raise _Bad(name, exc.args[0]) from None
    want = {
        "namespace_id": expect.namespace_id.hex(),
        "job_id": expect.job_id.hex(),
        "kind": expect.kind,
        "storage_id": expect.storage_id.hex(),
        "batch_size": expect.batch_size,
        "plan_revision": expect.plan_revision,
        "policy_revision": expect.policy_revision,
    }
    for key, value in want.items():
        if doc[key] != value:
            raise _Bad(name, f"manifest {key} differs from the job row")
    if expect.range is not None:
        lo, hi = expect.range
        if doc["range"] != range_doc(lo, hi, *expect.range_ids):
            raise _Bad(name, "manifest range differs from the range derived from the database")
    return doc


def _check_batch(
    seq: int, name: str, data: bytes, st: _State, expect: ChainExpectation, lines: str
) -> tuple[dict[str, Any], tuple[str, str]]:
    """Validate batch ``seq`` against the chain so far; returns (header, last key). The line
    checks cover the lines ``decode_batch(lines=...)`` parsed."""
    batch, last = _checked_batch(seq, name, data, st, expect, lines)
    return batch.header, last


def _checked_batch(
    seq: int, name: str, data: bytes, st: _State, expect: ChainExpectation, lines: str
) -> tuple[DecodedBatch, tuple[str, str]]:
    """:func:`_check_batch`, returning the decoded batch itself."""
    man = st.manifest
    assert man is not None
    src = man["source"]
    try:
        batch = decode_batch(data, settled_column=src["settled_column"], lines=lines)
    except FormatError as exc:
        raise _Bad(name, exc.args[0]) from None
    h = batch.header
    if h["job_id"] != expect.job_id.hex():
        raise _Bad(name, "batch job_id differs from the job")
    if h["seq"] != seq:
        raise _Bad(name, "batch header seq differs from the file name")
    if h["prev_sha256"] != st.link:
        raise _Bad(name, "batch prev_sha256 does not match the previous link")
    if h["roots"] > man["batch_size"]:
        raise _Bad(name, "batch holds more roots than batch_size")
    first, last = tuple(h["first"]), tuple(h["last"])
    if st.last_key is not None and first <= st.last_key:
        raise _Bad(name, "batch keys overlap or precede the previous batch")
    lo, hi = range_keys(man)
    if (lo is not None and first < lo) or last >= hi:
        raise _Bad(name, "batch holds a root outside the job range")
    if h["final"] and seq < expect.batches:
        raise _Bad(name, "final batch is not the last confirmed batch")
    ns = expect.namespace_id.hex()
    tables = {c["table"]: c["parent_column"] for c in src["children"]}
    for line in batch.lines:
        root = line["root"]
        if root.get("namespace_id") != ns:
            raise _Bad(name, "root namespace_id differs from the job's namespace")
        if set(line["children"]) != set(tables):
            raise _Bad(name, "child tables differ from the manifest source")
        for table, rows in line["children"].items():
            parent = tables[table]
            for row in rows:
                if row.get(parent) != root["id"] or row.get("namespace_id") != ns:
                    raise _Bad(name, "child row does not belong to its root")
    return batch, (str(last[0]), str(last[1]))


def check_manifest(name: str, data: bytes, expect: ChainExpectation) -> dict[str, Any]:
    """The manifest file ``name`` checked against the job row (and its range when ``expect``
    has one), as chain position 0 of a full walk checks it, for a reader that reads part of a
    chain (issue 28: export across jobs). Raises :class:`FormatError` with the reason."""
    try:
        if sha256_hex(data) != _named_sha(name, 0):
            raise _Bad(name, "contents do not hash to the sha256 in the name")
        return _check_manifest(name, data, expect)
    except _Bad as bad:
        raise FormatError(bad.reason) from None


def check_batch(
    seq: int,
    name: str,
    data: bytes,
    *,
    expect: ChainExpectation,
    manifest: dict[str, Any],
    link: str,
    after: tuple[str, str] | None,
) -> DecodedBatch:
    """Batch file ``name`` checked as chain position ``seq`` with every check of a full walk
    (its SHA-256 is its name, ``prev_sha256`` is ``link``, seq, job, batch size, keys inside the
    job range and after ``after`` -- the previous batch's last key when known --, namespace and
    children of every line), for a reader that reads part of a chain; returns it decoded.
    Raises :class:`FormatError` with the reason."""
    st = _State(link=link, last_key=after, manifest=manifest)
    try:
        if sha256_hex(data) != _named_sha(name, seq):
            raise _Bad(name, "contents do not hash to the sha256 in the name")
        batch, _ = _checked_batch(seq, name, data, st, expect, "all")
    except _Bad as bad:
        raise FormatError(bad.reason) from None
    return batch


def _named_sha(name: str, seq: int) -> str:
    parsed = parse_name(name)
    if parsed is None or parsed.seq != seq:
        raise _Bad(name, f"not the name of chain file {seq}")
    return parsed.sha256


def _parse_all(files: Sequence[tuple[str, FileData]]) -> dict[int, list[_File]]:
    groups: dict[int, list[_File]] = {}
    for name, data in sorted(files, key=lambda f: f[0]):
        parsed = parse_name(name)
        if parsed is None:
            raise _Bad(name, "not an orbit-archive/1 file name")
        groups.setdefault(parsed.seq, []).append((name, parsed, data))
    return groups


def _check_row(expect: ChainExpectation) -> None:
    if expect.batches < 0 or expect.roots < 0 or expect.bytes < 0:
        raise _Bad(None, "job row counts are negative")
    if expect.last_sha256 == "":
        if expect.batches or expect.roots or expect.bytes or expect.complete:
            raise _Bad(_missing_name(0), "job row has progress but no confirmed manifest")
    else:
        try:
            tail_name(expect.batches, expect.last_sha256)
        except ValueError:
            raise _Bad(None, "job row last_sha256 or batches is malformed") from None


def _step(
    seq: int, f: _File, st: _State, expect: ChainExpectation, lines: str = "all"
) -> tuple[dict[str, Any], tuple[str, str] | None, int]:
    name, parsed, source = f
    data = _load(source, name)
    if sha256_hex(data) != parsed.sha256:
        raise _Bad(name, "contents do not hash to the sha256 in the name")
    if seq == 0:
        return _check_manifest(name, data, expect), None, len(data)
    header, key = _check_batch(seq, name, data, st, expect, lines)
    return header, key, len(data)


def _wanted_names(groups: dict[int, list[_File]], last: int, last_sha: str) -> dict[int, str]:
    """Chain names by position, walked back from the tail through the headers' ``prev_sha256``
    (header lines only) down to the lowest position that holds more than one file. Only then
    is a name needed: at a position with one file, that file is the chain's or the chain is
    broken. Stops where a file is missing or unreadable (the forward walk reports it)."""
    wanted = {last: tail_name(last, last_sha)}
    crowded = [seq for seq, cands in groups.items() if seq < last and len(cands) > 1]
    seq = last
    while crowded and seq > min(crowded):
        found = [data for name, _, data in groups.get(seq, []) if name == wanted[seq]]
        if not found:
            break
        try:
            prev = batch_header(_load(found[0])).get("prev_sha256")
        except (FormatError, _Bad):
            break
        seq -= 1
        wanted[seq] = tail_name(seq, str(prev))
    return wanted


def _walk(
    files: Sequence[tuple[str, FileData]],
    expect: ChainExpectation,
    st: _State,
    allow_strays: bool = False,
    lines: str = "all",
    first: int = 0,
    more: Callable[[], bool] | None = None,
) -> int | None:
    """Verify chain positions ``first..`` (``st`` holds the chain through ``first - 1``);
    returns the position it stopped before when ``more()`` said so (at least one position is
    verified per call), else None: the whole chain and the row's totals verified."""
    _check_row(expect)
    groups = _parse_all(files)
    last = -1 if expect.last_sha256 == "" else expect.batches
    for seq in sorted(groups):
        if seq > last:
            st.beyond.extend(f[0] for f in groups[seq])
    wanted_at: dict[int, str] = {}
    if last >= 0:
        wanted_at = {last: tail_name(last, expect.last_sha256)}
        if allow_strays:
            wanted_at = _wanted_names(groups, last, expect.last_sha256)
    for seq in range(first, last + 1):
        if seq > first and more is not None and not more():
            return seq
        cands = groups.get(seq, [])
        wanted = wanted_at.get(seq)
        if not cands:
            raise _Bad(wanted or _missing_name(seq, groups), f"chain file {seq} is missing")
        # The row names the tail (and, walked back, the chain); otherwise prefer the candidate
        # that fits the chain.
        order = sorted(cands, key=lambda f: (f[0] != wanted, f[0]))
        if allow_strays and wanted is not None and order[0][0] == wanted:
            order = order[:1]  # the chain's own file must verify; the others are strays
        chosen: tuple[_File, dict[str, Any], tuple[str, str] | None, int] | None = None
        first_bad: _Bad | None = None
        for cand in order:
            try:
                doc, key, size = _step(seq, cand, st, expect, lines)
            except _Bad as bad:
                first_bad = first_bad or bad
                continue
            chosen = (cand, doc, key, size)
            break
        if chosen is None:
            assert first_bad is not None
            raise first_bad
        for other in cands:
            if other is not chosen[0]:
                if not allow_strays:
                    raise _Bad(other[0], f"second file for chain position {seq}")
                st.strays.append(other[0])
        (name, parsed, _), doc, key, size = chosen
        st.nbytes += size
        st.link = parsed.sha256
        if seq == 0:
            st.manifest, st.manifest_name = doc, name
        else:
            st.batches, st.roots, st.final = seq, st.roots + doc["roots"], doc["final"]
            st.last_key = key
    tail = tail_name(expect.batches, expect.last_sha256) if last >= 0 else None
    if last >= 0 and st.link != expect.last_sha256:
        raise _Bad(tail, "last link differs from the job row's last_sha256")
    if expect.complete and st.beyond:
        raise _Bad(st.beyond[0], "file beyond the confirmed chain of a finished job")
    if st.roots != expect.roots:
        raise _Bad(tail, "confirmed roots differ from the job row")
    if st.nbytes != expect.bytes:
        raise _Bad(tail, "confirmed bytes differ from the job row")
    if expect.complete:
        assert st.manifest is not None
        if expect.batches > 0 and not st.final:
            raise _Bad(tail, "last batch of a finished job is not final")
        if st.roots != st.manifest["roots_total"]:
            raise _Bad(st.manifest_name, "archived roots differ from manifest roots_total")
    return None


def verify_chain(
    files: Sequence[tuple[str, FileData]],
    *,
    expect: ChainExpectation,
    allow_strays: bool = False,
    lines: str = "all",
) -> VerifyReport:
    st = _State()
    try:
        _walk(files, expect, st, allow_strays, lines)
    except _Bad as bad:
        return st.report(bad)
    return st.report()


def _named(files: Sequence[tuple[str, FileData]], name: str, sha: str, missing: str) -> bytes:
    """The bytes of the file called ``name`` among ``files``, which must hash to ``sha``."""
    found = [data for n, data in files if n == name]
    if not found:
        raise _Bad(name, missing)
    data = _load(found[0], name)
    if sha256_hex(data) != sha:
        raise _Bad(name, "contents do not hash to the sha256 in the name")
    return data


def verify_prefix(
    files: Sequence[tuple[str, FileData]],
    *,
    expect: ChainExpectation,
    full: bool = False,
    allow_strays: bool = False,
    lines: str = "all",
) -> VerifyReport:
    if full:
        return verify_chain(
            files, expect=_not_complete(expect), allow_strays=allow_strays, lines=lines
        )
    st = _State()
    try:
        _check_row(expect)
        if expect.last_sha256 == "":
            st.beyond = sorted(name for name, _ in files)
            return st.report()
        name = tail_name(expect.batches, expect.last_sha256)
        data = _named(files, name, expect.last_sha256, "tail file is missing")
        if expect.batches == 0:
            st.manifest = _check_manifest(name, data, expect)
        else:
            try:
                header = decode_batch(data, lines=lines).header
            except FormatError as exc:
                raise _Bad(name, exc.args[0]) from None
            if header["job_id"] != expect.job_id.hex() or header["seq"] != expect.batches:
                raise _Bad(name, "tail header job_id or seq differs from the job row")
            if header["roots"] > expect.batch_size:
                raise _Bad(name, "batch holds more roots than batch_size")
            st.final, st.last_key = header["final"], (header["last"][0], header["last"][1])
        st.batches, st.roots, st.nbytes = expect.batches, expect.roots, expect.bytes
        st.link = expect.last_sha256
        for n, _ in sorted(files):
            p = parse_name(n)
            if p is not None and p.seq > expect.batches:
                st.beyond.append(n)
    except _Bad as bad:
        return st.report(bad)
    return st.report()


@dataclass(frozen=True)
class ChainProgress:
    """How far a resumable walk of a confirmed chain got (``orbit_archive_job_checks``, issue 24
    item 4): files ``0..checked-1`` verified, ``link`` the SHA-256 of the last of them, the roots
    and bytes through it, its last root's key, and the manifest's SHA-256 (re-read on resume)."""

    checked: int
    link: str
    roots: int
    bytes: int
    last: tuple[str, str] | None
    manifest_sha256: str


def verify_chain_part(
    files: Sequence[tuple[str, FileData]],
    *,
    expect: ChainExpectation,
    progress: ChainProgress | None,
    more: Callable[[], bool],
    allow_strays: bool = False,
    lines: str = "all",
) -> tuple[VerifyReport, ChainProgress | None]:
    """:func:`verify_prefix` (``full``) in parts: from ``progress`` (None: from the manifest)
    for as long as ``more()`` says (at least one file), returning the report and the progress
    to resume from (None: the walk ended -- the report is the whole chain's, ok or not). The
    report's ``strays`` cover the positions walked in this part only."""
    expect = _not_complete(expect)
    st = _State()
    first = 0
    try:
        if progress is not None:
            name = tail_name(0, progress.manifest_sha256)
            data = _named(files, name, progress.manifest_sha256, "chain file 0 is missing")
            st.manifest, st.manifest_name = _check_manifest(name, data, expect), name
            st.batches, st.roots, st.nbytes = progress.checked - 1, progress.roots, progress.bytes
            st.link, st.last_key, first = progress.link, progress.last, progress.checked
        stopped = _walk(files, expect, st, allow_strays, lines, first, more)
    except _Bad as bad:
        return st.report(bad), None
    if stopped is None:
        return st.report(), None
    assert st.manifest_name is not None
    parsed = parse_name(st.manifest_name)
    assert parsed is not None
    return st.report(), ChainProgress(
        stopped, st.link, st.roots, st.nbytes, st.last_key, parsed.sha256
    )


def _not_complete(expect: ChainExpectation) -> ChainExpectation:
    from dataclasses import replace

    return replace(expect, complete=False)
