"""Leftovers in a job directory (SPEC §5 steps 2, 5 and 6): listing it, removing the files of
dead claims under a live lease, and a stale writer's own file.

Which names are leftovers is decided by :mod:`orbit_tasks.archive.claims` (pure); this
module does the I/O, through the storage seam (:mod:`storage`: a folder or an S3 prefix). OS
errors become ``JobFailure(IO_ERROR)``, never a raw exception with a path in it; the object
store's own errors pass through to the runner (access denied, no such bucket, unavailable).
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection

from orbit_tasks.archive import claims
from orbit_tasks.archive.engine import verify
from orbit_tasks.archive.engine.storage import JobFiles
from orbit_tasks.archive.engine.volume import StoredFile
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.jobs import ErrorCode, JobFailure
from orbit_tasks.archive.store import jobs as store
from orbit_tasks.db.engine import Clock
from orbit_tasks.logs import log_action

log = logging.getLogger("orbit.archive.engine.leftovers")


def list_dir(directory: JobFiles) -> list[str]:
    """Every name in the job directory (temp files too), sorted; a missing directory is empty.
    The runner lists only on a takeover and in the final step."""
    return directory.names()


def remove(
    conn: Connection, c: store.Claim, clock: Clock, directory: JobFiles, names: list[str]
) -> None:
    """Remove leftovers of dead claims, right after checking that claim ``c`` still holds a live
    lease on the prefix it verified (a claim paused past its lease must not take the new
    owner's confirmed files for leftovers). An OS error is IO_ERROR."""
    if not names:
        return
    store.check_lease(conn, c, clock=clock)
    try:
        directory.remove(names)
    except OSError:  # read-only remount, EIO, EACCES, a directory under the name...
        raise JobFailure(ErrorCode.IO_ERROR) from None


def remove_unless_confirmed(
    conn: Connection, c: store.Claim, directory: JobFiles, name: str, stored: StoredFile
) -> None:
    """Step 6: claim ``c``'s confirm was rejected; remove the file it wrote unless that very name
    is confirmed.

    Only a file this claim created is removed, and on a folder only its own inode (the new
    owner may have re-written the same name meanwhile); what to do is
    :func:`claims.unconfirmed_file_fate` of the job row as it is now: only a name no claim can
    confirm any more is removed (a claim taking the job right after this read may find the
    file under its own name and confirm it). An object store has no inode to fence the delete
    on: after it the row is read again, and if the name got confirmed meanwhile its bytes (the
    same, whoever wrote them) are put back (a guard). Never raises:
    the owner's final step removes what stays."""
    if not stored.created:
        return  # the name existed already with identical bytes: not ours to remove
    try:
        if _confirmed_now(conn, c, directory, name):
            return
        removed = directory.remove_if_unconfirmed(name, set(), stored)
        unfenced = removed and stored.inode is None and stored.data is not None
        if unfenced and _confirmed_now(conn, c, directory, name):
            assert stored.data is not None
            directory.store(name, stored.data)  # confirmed meanwhile: put it back
            log_action(log, "archive.job.cleanup_restored", logging.WARNING, file=name)
    except Exception as exc:
        log_action(log, "archive.job.cleanup_skipped", logging.WARNING, error=type(exc).__name__)


def _confirmed_now(conn: Connection, c: store.Claim, directory: JobFiles, name: str) -> bool:
    """Must ``name`` stay, by the job row as it is now (or because we cannot tell)?"""
    with conn.begin():
        now_job = store.get_job(conn, c.job.namespace_id, c.job.id)
    parsed = file_names.parse_name(name)
    assert parsed is not None
    fate = claims.unconfirmed_file_fate(parsed.seq, now_job)
    if fate is claims.Fate.LEAVE:
        return True
    if fate is claims.Fate.REMOVE_IF_NOT_ON_CHAIN:
        assert now_job is not None
        on_chain = verify.confirmed_name_at(
            directory, now_job.batches, now_job.last_sha256, parsed.seq
        )
        return on_chain is None or on_chain == name  # cannot tell: the final step decides
    return False
