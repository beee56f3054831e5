"""Pure decisions of one archive claim (SPEC §5): every claim rule, beside the chain verifier in
``format/chain.py``.

No I/O, no clock: the runner reads the directory, the job row and the verifier's report, and
these functions decide what they mean.

* :func:`is_stalled` -- the stall guard of a takeover.
* :func:`over_budget`, :func:`file_cap` -- the byte budget of a job and the per-file cap.
* :func:`stray_names` -- which listed names a claim removes as leftovers of dead claims.
* :func:`source_changed` -- the ``SOURCE_CHANGED`` rule of the final step.
* :func:`fit_to_cap` -- halve a batch (by root count) until its file fits the per-file cap.
* :func:`unconfirmed_file_fate` -- step 6: what a writer whose confirm was rejected does with
  the file it wrote.
* :func:`chain_expectation` -- what a job row expects of its chain.
* :func:`read_ahead_roots` -- how many roots the next read-ahead query asks for.
* :class:`After`, :class:`Guard` -- what a confirm does with the lease, and the control
  generation its chained UPDATE requires.
* :func:`group_has_room` -- how many written files one confirm statement covers.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime

from orbit_tasks.archive.format.expectation import ChainExpectation, VerifyReport
from orbit_tasks.archive.format.names import TMP_PREFIX, parse_name
from orbit_tasks.archive.jobs import ErrorCode, Job, JobFailure, JobState
from orbit_tasks.archive.ranges import ArchiveRange

#: Per-file cap: one archive file (manifest or batch) may take at most a quarter of the job's
#: budget, and never more than 64 MiB: ``file_cap(max_bytes) = min(MAX_FILE_BYTES, max_bytes // 4)``
#: (256 KiB at the 1 MiB minimum budget). A batch whose file would be larger is halved by root
#: count until it fits; a single root whose file is still larger fails ``ROOT_TOO_LARGE``. Raising
#: the budget by ``retry --max-bytes`` raises the cap too.
MAX_FILE_BYTES = 64 * 1024 * 1024

#: One read-ahead query asks for at most this many roots (several batches per statement) ...
MAX_READ_AHEAD_ROOTS = 1000
#: ... and for no more than about this many bytes of encoded lines, so that a job of large
#: roots keeps a bounded amount in memory (the first query of a chain asks for one batch).
READ_AHEAD_BYTES = 8 * 1024 * 1024


#: Group durability (docs/archive-jobs.md, "Write-ahead depth"): a claim chain writes up to this
#: many prepared batch files as one group -- each written and ``fsync``-ed, then ONE directory
#: ``fsync`` -- and confirms them with ONE fenced statement, while the next group is written
#: ahead of that confirm (so up to twice this many files are beyond the confirmed prefix).
GROUP_FILES = 4
#: ... and a group holds at most this many bytes (one file whatever its size): the files in
#: memory stay bounded by a few groups.
GROUP_BYTES = 8 * 1024 * 1024


def group_has_room(files: int, size: int, next_size: int, *, controlled: bool = False) -> bool:
    """Whether a group of ``files`` files and ``size`` bytes takes one more of ``next_size``
    bytes: the first file always; then up to :data:`GROUP_FILES` files and
    :data:`GROUP_BYTES` bytes. A ``controlled`` chain (an archive control in force on its
    scope, or the load guard: its batch boundaries are checked) keeps one file per confirm, so
    a pause, a window, a throttle's turn per batch and the load guard act at every file as
    before; group durability is the speed of an unconstrained chain."""
    if files == 0:
        return True
    return not controlled and files < GROUP_FILES and size + next_size <= GROUP_BYTES


def is_stalled(attempts: int, batches: int, max_stalls: int) -> bool:
    """Stall guard, evaluated on a takeover with ``attempts`` *after* the takeover's increment.

    For a healthy job every claim confirms one file, so ``attempts - batches - 1`` counts the
    claims that confirmed nothing (dead workers, lost leases).
    """
    return attempts - batches - 1 >= max_stalls


def over_budget(bytes_so_far: int, size: int, max_bytes: int) -> bool:
    """``bytes + size > max_bytes`` fails; exactly reaching the budget is fine."""
    return bytes_so_far + size > max_bytes


def file_cap(max_bytes: int) -> int:
    return min(MAX_FILE_BYTES, max_bytes // 4)


def stray_names(names: Iterable[str], report: VerifyReport | None) -> list[str]:
    """Leftovers among a job directory's ``names``: temp files, and chain-format names that are
    not on the confirmed chain. ``report`` is the verifier's (verified with ``allow_strays``):
    its ``beyond`` (past the confirmed prefix) and ``strays`` (other files at confirmed
    positions). ``None`` = nothing is confirmed yet: every chain-format name is a leftover.
    Foreign names are never touched."""
    listed = list(names)
    if report is None:
        return [n for n in listed if n.startswith(TMP_PREFIX) or parse_name(n) is not None]
    doomed = set(report.beyond) | set(report.strays)
    return [n for n in listed if n.startswith(TMP_PREFIX) or n in doomed]


def source_changed(roots: int, roots_total: int | None, batches: int, tail_final: bool) -> bool:
    """Settled history changed under the job: the confirmed roots differ from the manifest's
    ``roots_total``, or the source ran out before a batch said ``final``."""
    return roots != roots_total or (batches > 0 and not tail_final)


def fit_to_cap(
    build: Callable[[int, bool], bytes], roots: int, final: bool, cap: int
) -> tuple[bytes, int, bool]:
    """The file of the first ``roots`` roots (``build(n, final)``), halved by root count (and no
    longer final) until it is at most ``cap`` bytes. Returns (bytes, roots, final); one root
    still over the cap is ``JobFailure(ROOT_TOO_LARGE)``."""
    while True:
        data = build(roots, final)
        if len(data) <= cap:
            return data, roots, final
        if roots == 1:
            raise JobFailure(ErrorCode.ROOT_TOO_LARGE)
        roots, final = roots // 2, False


class After(enum.StrEnum):
    """What a confirm does with the claim's lease (``store.jobs.confirm``)."""

    KEEP = "keep"  # the final batch: the lease is kept for the final step
    CHAIN = "chain"  # the next claim is taken in the same statement
    RELEASE = "release"  # the job goes back to PENDING (time slice over, or a wait)


class Guard(enum.StrEnum):
    """The control generation a chained confirm requires inside its UPDATE."""

    NONE = ""  # no guard (not chained, or no controls read)
    ROW = "row"  # the generation row holds the value the chain last read
    NO_ROW = "no_row"  # there is still no generation row


def confirm_guard(after: After, generation: int | None, no_generation: int) -> Guard:
    """The guard of a confirm: only a chained confirm of a claim chain that read the controls
    (``generation``) has one; ``no_generation`` is the value read when there was no row."""
    if after != After.CHAIN or generation is None:
        return Guard.NONE
    return Guard.NO_ROW if generation == no_generation else Guard.ROW


class Fate(enum.Enum):
    LEAVE = "leave"  # a live owner may confirm this very file (same name, same bytes)
    REMOVE = "remove"  # cannot be part of the confirmed chain
    REMOVE_IF_NOT_ON_CHAIN = "remove_if_not_on_chain"  # at a confirmed position: compare names


def unconfirmed_file_fate(seq: int, job: Job | None) -> Fate:
    """SPEC §5 step 6 for a file at chain position ``seq`` that this claim created and could not
    confirm, given the job row as it is now. While the job can still be claimed (RUNNING,
    PENDING, or FAILED awaiting a retry) and that position is not confirmed yet, the file is
    left alone: a claim -- live now, or taking the job the moment after this row was read --
    may find it under its own name (identical bytes; ``link`` and a conditional PUT never
    replace a name) and confirm that very file; a removal decided on this row would land after
    that. The final step of the job removes it if it stays unconfirmed. Only a finished job
    (SUCCEEDED, ABANDONED) can never confirm it."""
    if job is None:
        return Fate.REMOVE
    ahead = not job.has_manifest or seq > job.batches
    if ahead:
        return Fate.REMOVE if job.state in _CLOSED else Fate.LEAVE
    return Fate.REMOVE_IF_NOT_ON_CHAIN


#: States no claim leaves: a file ahead of their confirmed chain can never be confirmed.
_CLOSED = frozenset({JobState.SUCCEEDED, JobState.ABANDONED})


def read_ahead_roots(batch_size: int, encoded_bytes: int, encoded_roots: int) -> int:
    """Roots the next read-ahead query asks for: as many batches as fit in
    :data:`READ_AHEAD_BYTES` at the average encoded size seen so far, between one batch and
    :data:`MAX_READ_AHEAD_ROOTS`. Nothing seen yet: one batch."""
    if encoded_roots <= 0:
        return batch_size
    per_root = max(1, encoded_bytes // encoded_roots)
    return max(batch_size, min(MAX_READ_AHEAD_ROOTS, READ_AHEAD_BYTES // per_root))


def chain_expectation(
    job: Job, *, complete: bool, range: tuple[datetime | None, datetime] | None = None
) -> ChainExpectation:
    """What the job row expects of its chain: the one place a :class:`ChainExpectation` is built
    from a job (the runner, ``orbit job verify|export`` and restore)."""
    return ChainExpectation(
        namespace_id=job.namespace_id,
        job_id=job.id,
        kind=job.kind,
        storage_id=job.storage_id,
        batch_size=job.batch_size,
        plan_revision=job.plan_revision,
        policy_revision=job.policy_revision,
        batches=job.batches,
        roots=job.roots,
        bytes=job.bytes,
        last_sha256=job.last_sha256,
        complete=complete,
        range=range,
    )


def with_range(expect: ChainExpectation, rng: ArchiveRange) -> ChainExpectation:
    """``expect`` that also checks the manifest's range against ``rng`` (its bounds, and the root
    ids of those that are keys)."""
    return replace(expect, range=(rng.from_, rng.until), range_ids=(rng.from_id, rng.until_id))
