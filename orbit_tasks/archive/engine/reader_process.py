"""The read-ahead in a process of its own: the second core for the hot path (issue 19).

The runner's process spends most of its CPU reading roots, encoding their lines, gzipping and
hashing files (:mod:`readahead`), all under one GIL with the writes and confirms. Here the same
:class:`~readahead.ReadAhead` runs in a plain subprocess (``python -m
orbit_tasks.archive.engine.reader_process``: a prefork child is daemonic and may not start a
``multiprocessing`` child) with its own database connection, and hands the prepared files to
the runner over a pipe. The runner writes and confirms them exactly as before: the process
writes nothing, not to the database (its connection only reads) nor to a volume.

Protocol (both ends are this module; the pipe is private to the two processes): the runner
pickles one request ``(url, bounds, job, range, cursor, cap, check_url)`` at a time to the
process's stdin -- the URLs with their passwords travel only there, never in argv or the
environment; ``check_url`` is the primary's when ``url`` is its replica -- and the process
pickles, in order, one ``("batch", PreparedBatch)`` per file and then ``("end",)``, or
``("failure", code)`` for a job failure (SOURCE_INVALID, ...), ``("diverged", detail)`` for a
chunk of the replica that differs from the primary's, or ``("transient", detail)`` for any other
fault. A process that dies (killed, out of memory) ends its stream without an end:
:class:`ReaderLost`, a transient fault like a dropped database connection -- the claim stops and
its lease expires, never a job failure.

One warm spare is kept per runner process so a claim chain does not wait for an interpreter to
start (started when the previous chain ends: an interpreter's start-up beside a running chain
took a core from it). A process serves one chain at a time; a chain that took its final batch
(the stream then ends with ``end``) or a ``failure`` hands its process back as the spare, which
serves the next chain's request (issue 25: a catch-up runs one short chain per job, and an
interpreter's start-up per chain cost a core's worth of it). A chain that stops early (the slice
ends with prepared files unused) or loses its reader kills the process. A process dies with the
runner that started it (``PR_SET_PDEATHSIG``), so a killed worker leaves no reader behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from typing import IO, Any

from sqlalchemy import Engine

from orbit_tasks.archive.engine.readahead import (
    FILES_DEPTH,
    NOT_READY,
    Handover,
    NotReady,
    PreparedBatch,
    ReadAhead,
    drain,
    put_until,
)
from orbit_tasks.archive.jobs import ErrorCode, Job, JobFailure
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import source
from orbit_tasks.db.engine import BOUNDS_ATTR, is_mysql, make_engine, parse_database_url
from orbit_tasks.errors import ReaderLost, ReplicaDiverged
from orbit_tasks.logs import log_action
from orbit_tasks.settings import Settings

log = logging.getLogger("orbit.archive.engine.reader_process")

#: prepared files received and waiting for the runner: a whole group's worth (group
#: durability; the process holds more)
DEPTH = FILES_DEPTH
_PR_SET_PDEATHSIG = 1


class ProcessReadAhead:
    """:class:`ReadAhead`'s interface (``next``, ``ready``, a context manager) over a reader
    process."""

    def __init__(
        self,
        engine: Engine,
        job: Job,
        rng: ArchiveRange,
        cursor: source.Cursor | None,
        cap: int,
        check: Engine | None = None,
    ) -> None:
        self._request = (
            engine.url.render_as_string(hide_password=False),
            getattr(engine, BOUNDS_ATTR, None),
            job,
            rng,
            cursor,
            cap,
            None if check is None else check.url.render_as_string(hide_password=False),
        )
        self._items: Handover[tuple[Any, ...]] = Handover(DEPTH, lambda item: item[0] == "batch")
        self._done = False  # the stream ended (end, failure or fault): the process is finished
        self._final_seen = False  # the chain took the final batch: only ``end`` follows it
        self._last = ""  # the kind of the last item read from the stream
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def __enter__(self) -> ProcessReadAhead:
        self._proc = _take_process()
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            pickle.dump(self._request, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.flush()
        except OSError:  # the spare died before its request: its stream ends at once
            pass
        self._thread = threading.Thread(
            target=self._receive, args=(self._proc.stdout,), daemon=True,
            name=f"archive-reader-{self._request[2].id.hex()[:8]}",
        )  # fmt: skip
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next(self) -> PreparedBatch | None:
        return self._open(self._items.next())

    def ready(self) -> PreparedBatch | NotReady:
        item = self._items.ready()
        if item is NOT_READY:
            return NOT_READY
        batch: PreparedBatch = item[1]
        self._final_seen = batch.final
        return batch

    def _open(self, item: tuple[Any, ...]) -> PreparedBatch | None:
        kind = item[0]
        if kind == "batch":
            batch: PreparedBatch = item[1]
            self._final_seen = batch.final
            return batch
        self._done = True
        if kind == "end":
            return None
        if kind == "failure":
            raise JobFailure(ErrorCode(item[1]))
        if kind == "diverged":
            raise ReplicaDiverged(str(item[1]))
        raise ReaderLost(str(item[1]))

    def close(self) -> None:
        self._stop.set()
        proc = self._proc
        at_end = self._done or self._final_seen  # nothing but ``end`` is left in the stream
        if proc is not None and not at_end and proc.poll() is None:
            proc.kill()  # stopped early: it holds prepared files nobody will use
        drain(self._items.queue)  # unblock the receiving thread's put()
        if self._thread is not None:
            self._thread.join(10)
        reuse = (
            at_end
            and proc is not None
            and proc.poll() is None
            and self._thread is not None
            and not self._thread.is_alive()
            and self._last in ("end", "failure")  # the stream is read to a request's end
        )
        if proc is not None and reuse:
            _give_back(proc)  # its stream is read to the end: it serves the next chain
            return
        if proc is not None:
            _stop(proc)
        _start_spare()  # for the next chain: started now, not beside this one (it takes a core)

    def _receive(self, stream: IO[bytes]) -> None:
        """The process's stream into the queue, in order; a stream without its end is a lost
        reader."""
        while not self._stop.is_set():
            try:
                item = pickle.load(stream)
            except Exception as exc:  # noqa: BLE001 - EOF, a torn pickle: the process died
                code = self._proc.poll() if self._proc is not None else None
                item = ("lost", f"reader process ended ({type(exc).__name__}, exit {code})")
            self._last = item[0]
            if not put_until(self._items.queue, item, self._stop) or item[0] != "batch":
                return


# --- the spare process of this runner process ---------------------------------------------------

_spare: subprocess.Popen[bytes] | None = None
_spare_pid = 0  # the runner process that started it (a forked child starts its own)


def _spawn() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "orbit_tasks.archive.engine.reader_process", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        close_fds=True,
    )


def _give_back(proc: subprocess.Popen[bytes]) -> None:
    """A process whose chain read its stream to the end becomes the spare again (one spare: a
    surplus one is stopped)."""
    global _spare, _spare_pid
    if _spare is not None and _spare_pid == os.getpid() and _spare.poll() is None:
        _stop(proc)
        return
    _spare, _spare_pid = proc, os.getpid()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()
    proc.wait(10)


def _start_spare() -> None:
    global _spare, _spare_pid
    if _spare is None or _spare_pid != os.getpid() or _spare.poll() is not None:
        _spare, _spare_pid = _spawn(), os.getpid()


def uses_process(mode: str, mysql: bool) -> bool:
    """``process``, or ``auto`` on MySQL/MariaDB (threads on SQLite: the embedded default runs
    without servers and with a single writer)."""
    return mode == "process" or (mode == "auto" and mysql)


def warm(settings: Settings) -> None:
    """Start this process's spare reader now when its chains will use one."""
    backend = parse_database_url(settings.database_url).get_backend_name()
    if uses_process(settings.archive_reader, backend in ("mysql", "mariadb")):
        _start_spare()


def discard_spare() -> None:
    """Stop this process's spare (its environment is stale: tests that change failpoints)."""
    global _spare
    if _spare is not None and _spare_pid == os.getpid():
        _stop(_spare)
    _spare = None


def _take_process() -> subprocess.Popen[bytes]:
    global _spare
    _start_spare()
    proc, _spare = _spare, None
    assert proc is not None
    return proc


# --- the reader process itself ------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the runner that started it dies (Linux); elsewhere the broken
    pipe ends it at its next write."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """Serve requests one after the other until the runner closes the pipe (or a fault: the
    runner then stops this process). One engine per database, kept across requests."""
    engines: dict[tuple[str, Any], Engine] = {}
    try:
        while True:
            try:
                url, bounds, job, rng, cursor, cap, check_url = pickle.load(stdin)
            except EOFError:  # the runner exited (or never used this spare)
                return
            for u in (url, check_url):
                if u is not None and (u, repr(bounds)) not in engines:
                    engines[(u, repr(bounds))] = make_engine(u, bounds=bounds)
            engine = engines[(url, repr(bounds))]
            check = None if check_url is None else engines[(check_url, repr(bounds))]
            if not _serve_one(engine, check, stdout, job, rng, cursor, cap):
                return
    finally:
        for each in engines.values():
            each.dispose()


def _serve_one(
    engine: Engine,
    check: Engine | None,
    stdout: IO[bytes],
    job: Job,
    rng: ArchiveRange,
    cursor: source.Cursor | None,
    cap: int,
) -> bool:
    """One chain's stream; False when this process should stop (a fault, the runner gone)."""

    def send(*item: Any) -> None:
        pickle.dump(item, stdout, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.flush()

    try:
        with ReadAhead(engine, job, rng, cursor, cap, check) as ahead:
            while True:
                batch = ahead.next()
                if batch is None:
                    send("end")
                    return True
                send("batch", batch)
                if batch.final:
                    send("end")
                    return True
    except JobFailure as failure:
        send("failure", failure.code.value)
        return True
    except ReplicaDiverged as diverged:
        send("diverged", str(diverged))
        return False
    except BrokenPipeError:
        return False  # the runner stopped reading
    except Exception as exc:  # noqa: BLE001 - any other fault is transient for the runner
        log_action(log, "archive.reader.fault", logging.WARNING, error=type(exc).__name__)
        send("transient", type(exc).__name__)
        return False


def open_read_ahead(
    mode: str,
    engine: Engine,
    job: Job,
    rng: ArchiveRange,
    cursor: source.Cursor | None,
    cap: int,
    check: Engine | None = None,
) -> ReadAhead | ProcessReadAhead:
    """The read-ahead of a claim chain (ORBIT_ARCHIVE_READER, :func:`uses_process`): a reader
    process, or threads of the runner's process. ``check``: the primary, when ``engine`` is its
    replica (every chunk is checked against it, ``store/source_check.py``)."""
    if uses_process(mode, is_mysql(engine)):
        return ProcessReadAhead(engine, job, rng, cursor, cap, check)
    return ReadAhead(engine, job, rng, cursor, cap, check)


def main(argv: list[str]) -> None:
    _die_with_parent(int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C of a foreground worker: the runner decides
    out = os.fdopen(os.dup(1), "wb")  # the stream to the runner: a private descriptor ...
    os.dup2(2, 1)  # ... and anything printed by mistake goes to stderr, not into the stream
    _serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main(sys.argv)
