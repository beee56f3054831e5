"""Claim marks: the claim a pool child holds, where its worker's main process finds it when the
child dies (issue 25 item 5, docs/archive-jobs.md "A dead pool child").

A pool child of an archive worker keeps one small file,
``<var_dir>/archive-claims/<main pid>/<child pid>``, holding ``<ns> <job> <lease_id>`` (hex) of
the claim it holds now: written after each claim commits (the first claim and every claim a
confirm chains), emptied when the delivery ends. It is one ``pwrite`` of 99 bytes on a file the
child opened once (no fsync: the mark only has to survive the child, not the node).

When the child dies (SIGKILL, OOM) the main process survives and Celery reports the lost
delivery there (``task_failure`` with ``WorkerLostError``). The main process then reads the
dead child's mark and expires exactly that lease (``store.jobs.expire_lost_lease``: a
compare-and-set on the mark's ``lease_id`` while RUNNING) and publishes a wake-up, so another
claim takes the job over within seconds instead of one lease. Fencing stays the guard: only the
dead claim's own lease id can match, and a dead process writes nothing more. A mark that is
stale (the child died between a commit and its mark) names a lease that moved on: nothing
matches and the job waits out its lease, as before. A killed whole worker leaves no main
process to read the marks: one lease, as before.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import Engine

from orbit_tasks.archive.store import jobs as store
from orbit_tasks.archive.wakeups import Publisher, publish_wakeup
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.logs import log_action

log = logging.getLogger("orbit.archive.engine.claim_marks")

MARKS_DIR = "archive-claims"
_MARK_SIZE = 3 * 32 + 3  # "<ns> <job> <lease>\n"
_DEATH_WAIT = 2.0  # seconds a lost child may take to be gone (reported before its exit)

_fd: int | None = None  # this pool child's mark file (None: marks are off in this process)


def marks_dir(var_dir: Path, main_pid: int) -> Path:
    """The marks of the pool children of the worker whose main process is ``main_pid``."""
    return var_dir / MARKS_DIR / str(main_pid)


def enable(var_dir: Path) -> None:
    """In a pool child of an archive worker: open this child's mark file, empty."""
    global _fd
    folder = marks_dir(var_dir, os.getppid())
    folder.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    _fd = os.open(folder / str(os.getpid()), flags, 0o600)


def hold(ns_id: bytes, job_id: bytes, lease_id: bytes) -> None:
    """Record the claim this process holds now (a no-op where marks are off)."""
    if _fd is not None:
        os.pwrite(_fd, f"{ns_id.hex()} {job_id.hex()} {lease_id.hex()}\n".encode(), 0)


def clear() -> None:
    """This process holds no claim any more."""
    if _fd is not None:
        os.ftruncate(_fd, 0)


class Mark(NamedTuple):
    path: Path
    pid: int
    ns_id: bytes
    job_id: bytes
    lease_id: bytes


def read_mark(path: Path) -> Mark | None:
    """The mark in ``path``, or None (empty, partial, not a child's file)."""
    try:
        pid = int(path.name)
        data = path.read_bytes()
    except (ValueError, OSError):
        return None
    parts = data.decode("ascii", "replace").split()
    if len(data) != _MARK_SIZE or len(parts) != 3:
        return None
    try:
        ns_id, job_id, lease_id = (bytes.fromhex(p) for p in parts)
    except ValueError:
        return None
    return Mark(path, pid, ns_id, job_id, lease_id)


def is_gone(pid: int) -> bool:
    """The process has exited (no such process, or a zombie not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def lost_marks(folder: Path, ns_id: bytes, job_id: bytes, wait: float = _DEATH_WAIT) -> list[Mark]:
    """The marks of ``job_id`` in ``folder`` whose child has exited (waiting up to ``wait``
    seconds for one that is still going)."""
    marks = [
        m
        for p in (sorted(folder.iterdir()) if folder.is_dir() else [])
        if (m := read_mark(p)) is not None and (m.ns_id, m.job_id) == (ns_id, job_id)
    ]
    deadline = time.monotonic() + wait
    while any(not is_gone(m.pid) for m in marks) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [m for m in marks if is_gone(m.pid)]


def take_over_lost(
    engine: Engine,
    var_dir: Path,
    ns_hex: str,
    job_hex: str,
    *,
    publish: Publisher = publish_wakeup,
    clock: Clock = DB_CLOCK,
    main_pid: int | None = None,
) -> int:
    """In the main process of an archive worker, after its pool child lost the delivery of
    (``ns_hex``, ``job_hex``): expire the lease of each claim the dead child marked, remove its
    mark, and publish one wake-up per expired lease. Returns how many leases it expired."""
    ns_id, job_id = bytes.fromhex(ns_hex), bytes.fromhex(job_hex)
    folder = marks_dir(var_dir, os.getpid() if main_pid is None else main_pid)
    expired = 0
    for mark in lost_marks(folder, ns_id, job_id):
        job = store.expire_lost_lease(engine, ns_id, job_id, mark.lease_id, clock=clock)
        mark.path.unlink(missing_ok=True)
        log_action(
            log, "archive.job.child_lost", logging.WARNING, namespace_id=ns_id, job_id=job_id,
            pid=mark.pid, lease_expired=job is not None,
        )  # fmt: skip
        if job is not None:
            expired += 1
            publish(job.storage_id, job.namespace_id, job.id, kind=job.kind)
    return expired


def remove_marks(var_dir: Path, main_pid: int) -> None:
    """The worker's main process is shutting down: its children's marks go with it."""
    shutil.rmtree(marks_dir(var_dir, main_pid), ignore_errors=True)
