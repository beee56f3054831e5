"""Failpoints for fault tests: inert unless ``ORBIT_FAILPOINTS`` is set.

``ORBIT_FAILPOINTS="archive.after_file_write=pause:/tmp/marker;archive.after_claim=exit"``

Actions:
- ``pause:<marker>`` — create the marker file (its content is the process id), then sleep forever,
  so that a test can ``SIGKILL`` or ``SIGSTOP`` the process at exactly that point.
- ``stop:<marker>`` — create the marker file, then ``SIGSTOP`` this very process; it continues
  where it stopped when the test sends ``SIGCONT`` (a stale worker coming back).
- ``hold:<marker>`` — create the marker file, then wait (holding whatever it holds: an open
  transaction, a file) until the test removes the marker; then continue. With ``SIGSTOP`` of
  the whole process group in between, a frozen node that comes back.
- ``sleep:<seconds>`` — sleep that long, then continue (a slow disk or a busy host: claims that
  reach the end of their time slice).
- ``exit`` — ``os._exit(137)`` immediately (a crash without cleanup).
- ``oserror:<ERRNO>`` — raise ``OSError`` with that errno name (e.g. ``oserror:EIO``), as the
  system call at this point would: tests the cleanup of every failure path of a durable write.

Names used by the archive runner: ``archive.after_claim``, ``archive.after_file_write`` (durably
written, not yet confirmed), ``archive.after_group_write`` (a group of batch files durable, not
confirmed, nothing written after it), ``archive.before_confirm`` (the next group may be being
written ahead), ``archive.after_confirm``, ``archive.before_finalize``, and in its
read-ahead thread ``archive.read_ahead`` (a prepared batch file handed over, not written);
the job store's ``archive.finalize.before_commit`` (SUCCEEDED and the plan written, not
committed: the job and plan rows are locked). The relay's ``sender.claim.before_commit`` (a page
of outbox rows claimed, not committed); the retention's ``sender.prune.before_commit`` (a page
of outbox rows deleted and their compact records inserted, not committed); the bulk requeue's
``sender.requeue.after_page`` (a page of REVIEW rows read, nothing locked) and
``sender.requeue.before_commit`` (the page's rows locked and requeued, not committed).
Durable writes of ``archive/volume.py``: ``volume.before_publish`` (temp file written and
synced), ``volume.before_dir_fsync`` (name published), ``volume.after_aside`` (an inode-fenced
removal has renamed the name aside). S3 storages: ``objects.before_put`` (a conditional PUT is
about to be sent), ``objects.identity`` (the identity object about to be read: a
slow endpoint). ``orbit storage init``: ``storage.init.before_commit``
(identity file durable, registry row not committed).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

ENV = "ORBIT_FAILPOINTS"
_hits: dict[str, int] = {}


def _parse(raw: str) -> dict[str, str]:
    points: dict[str, str] = {}
    for part in raw.replace(",", ";").split(";"):
        part = part.strip()
        if not part or "=" not in part:
            continue
        name, action = part.split("=", 1)
        points[name.strip()] = action.strip()
    return points


def hit(name: str) -> None:
    """Trigger failpoint ``name`` if configured; a no-op otherwise."""
    raw = os.environ.get(ENV)
    if not raw:
        return
    action = _parse(raw).get(name)
    if action is None:
        return
    verb, sep, rest = action.partition(":")
    if "@" in verb:
        verb, nth = verb.split("@", 1)
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != int(nth):
            return
        action = verb + sep + rest
    if action == "exit":
        os._exit(137)
    if action.startswith("oserror:"):
        code = getattr(errno, action[len("oserror:") :])
        raise OSError(code, os.strerror(code))
    if action.startswith("stop:"):
        marker = Path(action[len("stop:") :])
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if action.startswith("sleep:"):
        time.sleep(float(action[len("sleep:") :]))
        return
    if action.startswith("hold:"):
        marker = Path(action[len("hold:") :])
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
        while marker.exists():
            time.sleep(0.05)
        return
    if action.startswith("pause:"):
        marker = Path(action[len("pause:") :])
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
        while True:  # until the test kills or stops the process
            time.sleep(3600)
