"""Read-ahead of an archive claim chain (SPEC §5 step 3): the next batch files, built in threads.

While the runner writes batch *n* durably and confirms it, two threads prepare the files after
it: a *reader* (its own connection for the whole chain) asks for several batches' roots per
keyset query (:func:`claims.read_ahead_roots`) -- read from a replica, each such chunk is checked
against the primary first (``store/source_check.py``: a difference ends the stream with
:class:`ReplicaDiverged` after the files of the chunks before it) -- and encodes them into
canonical lines; a
*packer* cuts the lines into files of ``batch_size`` roots (halved to fit the per-file cap),
gzips and hashes them. Reading, gzip, hashing, ``fsync`` and the database round trips release
the GIL, so the stages overlap. The threads write nothing: not to the database, not to the
volume. Files reach the volume only through the runner, in order.

Each prepared file links to the one before it (``prev_sha256``) as the packer built it; the
runner checks that the chain it confirmed is the one the file extends. Errors (a value that
cannot be encoded, a root over the cap, a database fault) travel to the runner in order, after
the files prepared before them.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine

from orbit_tasks import failpoints
from orbit_tasks.archive import claims
from orbit_tasks.archive.format import batch as ff
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.format.lines import Key, LineEncoder
from orbit_tasks.archive.jobs import ErrorCode, Job, JobFailure
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import source, source_check
from orbit_tasks.logs import log_action

log = logging.getLogger("orbit.archive.engine.readahead")

DEPTH = 2  # encoded chunks waiting for the next stage
#: prepared files waiting for the runner: a whole group's worth (group durability)
FILES_DEPTH = claims.GROUP_FILES


@dataclass(frozen=True)
class PreparedBatch:
    seq: int
    prev_sha256: str
    name: str
    data: bytes
    sha256: str
    roots: int
    final: bool


@dataclass(frozen=True)
class _Lines:
    """Encoded roots of one keyset query, in key order; ``has_more``: a root follows them."""

    items: list[tuple[Key, bytes]]
    has_more: bool


@dataclass(frozen=True)
class _Exhausted:
    """The source has no root after the last prepared file."""


@dataclass(frozen=True)
class _Raised:
    error: BaseException


class NotReady(enum.Enum):
    NOT_READY = "not_ready"


NOT_READY = NotReady.NOT_READY  # ReadAhead.ready(): nothing prepared yet

T = TypeVar("T")


def put_until(q: queue.Queue[T], item: T, stop: threading.Event) -> bool:
    """Put ``item``, waiting for room until ``stop`` is set (False: stopped first)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False


def drain(q: queue.Queue[Any]) -> None:
    """Empty ``q`` (unblocks a producer waiting in :func:`put_until` for room)."""
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


class Handover(Generic[T]):
    """The runner's end of a read-ahead (a thread's or a process's): prepared files, then one
    item that ends the stream (the source's end, a failure), in order. :meth:`ready` takes a
    file only when one is prepared; an ending item it meets is held for :meth:`next`, so the
    runner meets it after the confirm it is about to send."""

    def __init__(self, depth: int, is_file: Callable[[T], bool]) -> None:
        self.queue: queue.Queue[T] = queue.Queue(depth)
        self._is_file = is_file
        self._held: T | None = None

    def next(self) -> T:
        """The next item, waiting for it."""
        item = self._held if self._held is not None else self.queue.get()
        self._held = None
        return item

    def ready(self) -> T | NotReady:
        """The next file if it is prepared, else :data:`NOT_READY`."""
        if self._held is not None:
            return NOT_READY
        try:
            item = self.queue.get_nowait()
        except queue.Empty:
            return NOT_READY
        if not self._is_file(item):
            self._held = item
            return NOT_READY
        return item


class ReadAhead:
    """Prepares the batch files after ``job``'s confirmed tail (``cursor`` = its last root).

    Use as a context manager; :meth:`next` returns the next :class:`PreparedBatch`, or None when
    the source has no more roots, and raises what a thread raised. Leaving the context stops
    the threads (daemons: a thread stuck in a query never blocks the worker's exit).
    """

    def __init__(
        self,
        engine: Engine,
        job: Job,
        rng: ArchiveRange,
        cursor: source.Cursor | None,
        cap: int,
        check: Engine | None = None,
    ) -> None:
        self._engine = engine
        self._check = check  # the primary, when ``engine`` is its replica (issue 24)
        self._job = job
        self._rng = rng
        self._cursor = cursor
        self._cap = cap
        self._lines: queue.Queue[_Lines | _Raised] = queue.Queue(DEPTH)
        self._out: Handover[PreparedBatch | _Exhausted | _Raised] = Handover(
            FILES_DEPTH, lambda item: isinstance(item, PreparedBatch)
        )
        self._stop = threading.Event()
        tag = job.id.hex()[:8]
        self._threads = [
            threading.Thread(target=self._run, args=(self._read, self._lines), daemon=True,
                             name=f"archive-read-{tag}"),
            threading.Thread(target=self._run, args=(self._pack, self._out.queue), daemon=True,
                             name=f"archive-pack-{tag}"),
        ]  # fmt: skip

    def __enter__(self) -> ReadAhead:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next(self) -> PreparedBatch | None:
        """The next prepared file, waiting for it; None when the source has no more roots."""
        return self._open(self._out.next())

    def ready(self) -> PreparedBatch | NotReady:
        """The next prepared file if it is ready, else :data:`NOT_READY`. The end of the source
        and errors are only ever delivered by :meth:`next` (so the runner meets them after the
        confirm it is about to send, in order)."""
        item = self._out.ready()
        assert item is NOT_READY or isinstance(item, PreparedBatch)
        return item

    @staticmethod
    def _open(item: PreparedBatch | _Exhausted | _Raised) -> PreparedBatch | None:
        if isinstance(item, _Raised):
            raise item.error
        if isinstance(item, _Exhausted):
            return None
        return item

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        for q in (self._out.queue, self._lines):  # unblock a put() waiting for room
            drain(q)
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    # --- the threads -----------------------------------------------------------------------

    def _put(self, q: queue.Queue[Any], item: Any) -> bool:
        return put_until(q, item, self._stop)

    def _take(self, q: queue.Queue[Any]) -> Any:
        while not self._stop.is_set():
            try:
                return q.get(timeout=0.2)
            except queue.Empty:
                continue
        return None

    def _run(self, stage: Callable[[], None], out: queue.Queue[Any]) -> None:
        try:
            stage()
        except BaseException as exc:  # delivered to the runner, which decides what it means
            if not self._stop.is_set():
                self._put(out, _Raised(exc))

    def _read(self) -> None:
        """Keyset queries of several batches' roots; each chunk encoded into lines."""
        job = self._job
        encoder = source.line_encoder(job.kind)
        cursor, last = self._cursor, None
        encoded_bytes = encoded_roots = 0
        with self._engine.connect() as conn, contextlib.ExitStack() as stack:
            primary = None if self._check is None else stack.enter_context(self._check.connect())
            while not self._stop.is_set():
                limit = claims.read_ahead_roots(job.batch_size, encoded_bytes, encoded_roots)
                with conn.begin():  # short: SQLite's BEGIN IMMEDIATE must not linger
                    chunk = source.read_chunk(
                        conn, job.kind, job.namespace_id, self._rng, cursor, limit
                    )
                if primary is not None:  # before any line of the chunk reaches a file
                    with primary.begin():
                        source_check.check_chunk(
                            primary, job.kind, job.namespace_id, self._rng, cursor, chunk
                        )
                items = encode_chunk(encoder, chunk, last)
                encoded_bytes += sum(len(line) for _, line in items)
                encoded_roots += len(items)
                if not self._put(self._lines, _Lines(items, chunk.has_more)) or not chunk.has_more:
                    return
                cursor, last = chunk.cursor, items[-1][0]

    def _pack(self) -> None:
        """Files of ``batch_size`` roots from the lines, in order, each linked to the last."""
        job = self._job
        pending: deque[tuple[Key, bytes]] = deque()
        seq, prev = job.batches + 1, job.last_sha256
        has_more = True
        while not self._stop.is_set():
            while len(pending) < job.batch_size and has_more:
                item = self._take(self._lines)
                if item is None:
                    return
                if isinstance(item, _Raised):
                    raise item.error
                pending.extend(item.items)
                has_more = item.has_more
            if not pending:
                self._put(self._out.queue, _Exhausted())
                return
            take = min(job.batch_size, len(pending))
            batch = [pending[i] for i in range(take)]
            final = not has_more and take == len(pending)
            data, roots, final = claims.fit_to_cap(
                batch_builder(job, seq, prev, batch), take, final, self._cap
            )
            for _ in range(roots):
                pending.popleft()
            sha = fv.sha256_hex(data)
            prepared = PreparedBatch(
                seq, prev, file_names.batch_name(seq, sha), data, sha, roots, final
            )
            if not self._put(self._out.queue, prepared):
                return
            failpoints.hit("archive.read_ahead")
            if final:
                return
            seq, prev = seq + 1, sha


def batch_builder(
    job: Job, seq: int, prev: str, batch: list[tuple[Key, bytes]]
) -> Callable[[int, bool], bytes]:
    """Builds the file of the first ``n`` roots of ``batch`` (for :func:`fit_to_cap`)."""

    def build(n: int, final: bool) -> bytes:
        return ff.build_batch_file(
            job_id=job.id, seq=seq, prev_sha256=prev, lines=[line for _, line in batch[:n]],
            first=batch[0][0], last=batch[n - 1][0], final=final,
        )  # fmt: skip

    return build


def encode_chunk(
    encoder: LineEncoder, chunk: source.RootChunk, last: Key | None
) -> list[tuple[Key, bytes]]:
    """The chunk's roots as (key, canonical line), in strictly increasing key order after
    ``last`` (the key before the chunk). A value that cannot be encoded is SOURCE_INVALID."""
    out: list[tuple[Key, bytes]] = []
    try:
        for root in chunk.roots:
            key = encoder.key(root)
            if last is not None and key <= last:
                raise fv.SourceInvalid("roots are not in strictly increasing (settled, id) order")
            rid = encoder.root_id(root)
            kids = {table: rows.get(rid, ()) for table, rows in chunk.children.items()}
            out.append((key, encoder.line(root, kids)))
            last = key
    except fv.SourceInvalid as exc:
        log_action(log, "archive.job.source_invalid", logging.WARNING, reason=str(exc))
        raise JobFailure(ErrorCode.SOURCE_INVALID) from None
    return out
