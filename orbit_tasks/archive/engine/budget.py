"""Budget-sized ranges (SPEC §5 catch-up): the measured size of a range's roots, and the end of a
range that would not fit its job's ``max_bytes``.

The measure is a sample (docs/archive-jobs.md "Budget-sized ranges"): up to ``SAMPLE_ROOTS``
roots read at ``SAMPLE_POINTS`` evenly spaced settled times of the range, encoded into lines by
the runner's own encoder and packed into batch files (headers and gzip members included) by its
own builder and cap rule. ``orbit plan preview`` extrapolates it to the range; a job's first
claim cuts its range with it (:func:`fit_range`): the roots that fit are counted with
:func:`~orbit_tasks.archive.ranges.roots_within_budget` (a margin on the measured bytes per root,
the manifest beside them), and the end is put just after the last of them, found on the settled
index (:func:`~orbit_tasks.archive.store.source.keys_from`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Connection

from orbit_tasks.archive import claims
from orbit_tasks.archive.engine.readahead import batch_builder, encode_chunk
from orbit_tasks.archive.format import manifest as fm
from orbit_tasks.archive.format.lines import Key
from orbit_tasks.archive.jobs import Job, JobFailure
from orbit_tasks.archive.ranges import ArchiveRange, end_between, roots_within_budget
from orbit_tasks.archive.store import source
from orbit_tasks.platform.history import history_kind

SAMPLE_POINTS = 8  # evenly spaced settled times of the range
SAMPLE_ROOTS = 128  # at most, in total (>= the largest batch size, 100)
#: The cursor id that sorts after every real root id at one settled time.
_AFTER_EVERY_ID = b"\xff" * 16


def manifest_bytes(job: Job, rng: ArchiveRange, roots_total: int) -> bytes:
    """The manifest of ``job`` for its range and ``roots_total``."""
    return fm.build_manifest(
        namespace_id=job.namespace_id,
        job_id=job.id,
        kind=job.kind,
        plan_revision=job.plan_revision,
        policy_revision=job.policy_revision,
        storage_id=job.storage_id,
        batch_size=job.batch_size,
        range_from=rng.from_,
        range_until=rng.until,
        range_from_id=rng.from_id,
        range_until_id=rng.until_id,
        roots_total=roots_total,
        source=fm.source_descriptor(history_kind(job.kind)),
        created_at=job.created_at,
    )


@dataclass(frozen=True)
class Estimate:
    """Bytes and files of the job, extrapolated from the sample."""

    sample_roots: int
    bytes: int  # manifest + batch files
    files: int  # manifest + batch files
    bytes_per_root: float
    roots_per_file: float
    sample_bytes: int = 0  # the sample's roots packed as batch files


def manifest_file(conn: Connection, job: Job, rng: ArchiveRange) -> tuple[bytes, int]:
    """Step 3 for a job without a confirmed manifest: its bytes and ``roots_total`` (counted on
    ``conn``: the primary's connection) over ``rng`` as it is (the runner's and repair's)."""
    with conn.begin():
        total = source.count_roots(conn, job.kind, job.namespace_id, rng)
    return manifest_bytes(job, rng, total), total


def estimate(conn: Connection, job: Job, rng: ArchiveRange, roots: int) -> Estimate:
    """Bytes and files of ``job`` over ``rng`` (``roots`` roots) from a sample of its roots,
    encoded and packed exactly as the runner would."""
    manifest = len(manifest_bytes(job, rng, roots))
    lines = _sample_lines(conn, job, rng)
    if roots == 0 or not lines:
        return Estimate(len(lines), manifest, 1, 0.0, 0.0)
    cap = claims.file_cap(job.max_bytes)
    sample_bytes = 0
    per_file: list[int] = []  # roots of each sample file that had a whole batch to take
    pending, seq = lines, 1
    while pending:
        take = min(job.batch_size, len(pending))
        build = batch_builder(job, seq, "0" * 64, pending[:take])
        data, packed, _final = claims.fit_to_cap(build, take, False, cap)
        sample_bytes += len(data)
        if take == job.batch_size or packed < take:  # a whole batch, or cut by the cap
            per_file.append(packed)
        pending, seq = pending[packed:], seq + 1
    per_root = sample_bytes / len(lines)
    roots_per_file = sum(per_file) / len(per_file) if per_file else float(job.batch_size)
    files = math.ceil(roots / roots_per_file)
    return Estimate(
        len(lines), manifest + math.ceil(per_root * roots), 1 + files, per_root, roots_per_file,
        sample_bytes,
    )  # fmt: skip


def _sample_lines(conn: Connection, job: Job, rng: ArchiveRange) -> list[tuple[Key, bytes]]:
    """Up to ``SAMPLE_ROOTS`` encoded roots: ``SAMPLE_ROOTS / SAMPLE_POINTS`` roots from each of
    ``SAMPLE_POINTS`` evenly spaced settled times of the range's first to last root, in key
    order, each root once."""
    span = source.settled_span(conn, job.kind, job.namespace_id, rng)
    if span is None:
        return []
    first, last = span
    step = (last - first) / SAMPLE_POINTS
    per_point = SAMPLE_ROOTS // SAMPLE_POINTS
    encoder = source.line_encoder(job.kind)
    seen: dict[Key, bytes] = {}
    for k in range(SAMPLE_POINTS):
        at = first + step * k
        # the cursor (at - 1 us, no id beyond it) starts at the first root settled at `at`
        cursor = (at - timedelta(microseconds=1), _AFTER_EVERY_ID)
        chunk = source.read_chunk(conn, job.kind, job.namespace_id, rng, cursor, per_point)
        for key, line in encode_chunk(encoder, chunk, None):
            seen.setdefault(key, line)
    return sorted(seen.items())


@dataclass(frozen=True)
class Fitted:
    """A range fitted to its job's budget: the range (cut or not), its exact root count, and
    the sample it was measured with."""

    range: ArchiveRange
    roots_total: int
    sample_roots: int
    sample_bytes: int


def fit_range(conn: Connection, job: Job, rng: ArchiveRange) -> Fitted:
    """``rng``, or its first part whose files fit ``job.max_bytes`` (SPEC §5 budget-sized
    ranges), read on the source ``conn``: the sample's bytes per root give how many roots fit;
    when the range holds more, its end moves to just after the last root that fits. The count
    of roots is exact: a cut range holds the roots that fit (the index walk that found its end
    passed exactly those), a range not cut is counted on the source."""
    try:
        est = estimate(conn, job, rng, 1)
    except JobFailure:  # the sample met a root no file can hold (SOURCE_INVALID, ROOT_TOO_LARGE):
        est = None  # no cut, the batches meet it in order and fail there, as without a budget
    if est is None or est.sample_roots == 0:  # or no root in the range: nothing to cut
        return Fitted(rng, source.count_roots(conn, job.kind, job.namespace_id, rng), 0, 0)
    fits = roots_within_budget(job.max_bytes, len(manifest_bytes(job, rng, 0)), est.bytes_per_root)
    keys = source.keys_from(conn, job.kind, job.namespace_id, rng, fits - 1, 2)
    if len(keys) == 2:  # root number fits + 1 exists: the range ends before it
        # The cut range holds exactly roots 1..fits: its end lies between the keys of roots
        # number fits and fits + 1 (adjacent in (settled, id) order, read in this transaction
        # by the same index walk), so the walk has counted them; no second count.
        return Fitted(rng.ending_at(end_between(keys[0], keys[1])), fits, *_sampled(est))
    total = source.count_roots(conn, job.kind, job.namespace_id, rng)
    return Fitted(rng, total, *_sampled(est))


def _sampled(est: Estimate) -> tuple[int, int]:
    return est.sample_roots, est.sample_bytes
