"""Archive volumes on disk: the identity file, durable writes, job file listing and cleanup.

Durable write protocol (SPEC §5 step 4): write to a unique ``.tmp-`` name, ``fsync`` it, publish it
under the final name, ``fsync`` the directory; only then may the database confirm the file. A
failed write never leaves its temp file behind, whichever step failed (:func:`_write_temp` and the
``finally`` of each publisher); a name that was already published stays (see each function).

Job files (:func:`write_job_file`) are content-addressed (``<seq>-<sha256>...``), so one name has
exactly one valid content. They are published with ``link(tmp, final)`` instead of ``rename``:
``link`` never replaces an existing name, so a stale writer (a claim whose lease was lost) can
never replace a file, confirmed or not; if the name exists, its bytes must equal ours (else
:class:`FileConflict`) and it is left untouched. The volume must support hard links (local
filesystems and NFS do). Directories created on the way are fsynced into their parents.

Removal by a stale writer (SPEC §5 step 6, :func:`remove_file_if_unconfirmed`) is inode-fenced:
it only deletes the inode it created itself (it renames the name away, checks the inode, and puts
a foreign inode back with ``link``), so it cannot delete the same-named file that the new owner
re-wrote after removing the stale writer's leftovers.

Errors: ``ENOSPC``/``EDQUOT`` -> :class:`DiskFull` (job code ``DISK_FULL``), any other OS error ->
:class:`ArchiveIOError` (``IO_ERROR``). Messages hold the file name and errno name, never contents.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePath

from orbit_tasks import failpoints, oserrors
from orbit_tasks.archive.format.names import TMP_PREFIX, ParsedName, parse_name
from orbit_tasks.archive.format.values import sha256_hex
from orbit_tasks.errors import ConflictError, InvalidInput, OrbitError
from orbit_tasks.ids import from_hex

IDENTITY_FILE = ".orbit-volume.json"
VOLUME_FORMAT = "orbit-volume/1"


@dataclass(frozen=True)
class VolumeIdentity:
    path: PurePath  # a folder's resolved Path; an S3 storage's s3://bucket/prefix
    storage_id: bytes
    label: str


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_identity(path: Path | str) -> VolumeIdentity:
    """Read and validate ``<path>/.orbit-volume.json``."""
    root = Path(path)
    ident = root / IDENTITY_FILE
    try:
        data = ident.read_bytes()
    except FileNotFoundError:
        raise InvalidInput(
            f"{root} is not an archive volume (no {IDENTITY_FILE}): is the volume mounted there?"
        ) from None
    except OSError as exc:
        raise InvalidInput(f"{ident} is unreadable: {type(exc).__name__}") from None
    return parse_identity(data, str(ident), root.resolve())


def parse_identity(data: bytes, where: str, root: PurePath) -> VolumeIdentity:
    """Validate the bytes of an identity file or object (``where`` names it in messages)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise InvalidInput(f"{where} is unreadable: {type(exc).__name__}") from None
    if not isinstance(doc, dict) or doc.get("format") != VOLUME_FORMAT:
        raise InvalidInput(f"{where} is not of format {VOLUME_FORMAT!r}")
    storage_id = from_hex(str(doc.get("storage_id", "")), "storage_id")
    return VolumeIdentity(root, storage_id, str(doc.get("label", "")))


#: How many folders (or S3 prefixes) ``storage init`` looks through for storages that a new
#: storage would contain (docs/decisions.md, issue 27): a new storage is an empty folder or
#: prefix, or nearly; past this many it is refused rather than half checked.
NEST_SCAN_LIMIT = 1000


class NestScanTooLarge(ConflictError):
    """A new storage's place holds more folders or prefixes than :data:`NEST_SCAN_LIMIT`."""


def identity_below(root: Path, *, limit: int = NEST_SCAN_LIMIT) -> Path | None:
    """The first folder strictly below ``root`` that holds an identity file, breadth first (a
    mounted volume usually sits one or two levels down), or None. Symbolic links are not
    followed; a folder this user cannot list is skipped (``lost+found`` of a fresh file system).
    More than ``limit`` folders: :class:`NestScanTooLarge`."""
    queue = [root]
    seen = 0
    while queue:
        current = queue.pop(0)
        try:
            with os.scandir(current) as entries:
                subdirs = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for sub in sorted(subdirs):
            seen += 1
            if seen > limit:
                raise NestScanTooLarge(
                    f"{root} holds more than {limit} folders; a new archive volume must not "
                    "contain another and is checked folder by folder: choose an empty folder"
                )
            try:
                (sub / IDENTITY_FILE).lstat()
            except OSError:  # none there, or not ours to see (skipped as unlistable)
                queue.append(sub)
                continue
            return sub
    return None


def identity_document(storage_id: bytes, label: str) -> bytes:
    """The bytes of an identity file or object: canonical JSON and a newline."""
    doc = {"format": VOLUME_FORMAT, "label": label, "storage_id": storage_id.hex()}
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")


def write_identity(path: Path | str, storage_id: bytes, label: str) -> VolumeIdentity:
    """Write the identity file of a new volume. Refuses a path that names a different storage.

    The file is published with ``link()``, which never replaces an existing name: of two
    concurrent ``storage init`` runs on one path exactly one identity wins, and the loser reads
    it back (and is refused if it is not the one it meant to write). Missing directories are
    created and synced into their parents.

    Failures (docs/decisions.md, "storage init"): before the name is published nothing is left
    behind (no temp file, no directory created on the way) and the error is :class:`DiskFull`,
    :class:`InvalidInput` (the path cannot hold a volume: read-only, not a directory, ...) or
    :class:`ArchiveIOError`. After it, the file stays -- another ``storage init`` may already
    have read and registered it -- and the :class:`ArchiveIOError` says that a rerun registers it.
    """
    root = Path(path)
    final = root / IDENTITY_FILE
    if final.exists():
        return _existing_identity(root, storage_id)
    data = identity_document(storage_id, label)
    created: list[Path] = []
    tmp: Path | None = None
    published = False
    try:
        _ensure_dir(root, created)
        tmp, _ = _write_temp(root, IDENTITY_FILE, data)
        failpoints.hit("volume.before_publish")
        try:
            os.link(tmp, final)
        except FileExistsError:
            return _existing_identity(root, storage_id)
        published = True
        os.unlink(tmp)
        tmp = None
        failpoints.hit("volume.before_dir_fsync")
        fsync_dir(root)
    except OSError as exc:
        if published:
            raise ArchiveIOError(
                f"{root}: the identity file of storage {storage_id.hex()} is written but could "
                f"not be synced ({oserrors.errno_name(exc)}); run `orbit storage init {root}` "
                "again to register it"
            ) from None
        raise _identity_error(exc, root) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if not published:
            _remove_empty_dirs(created)
    return VolumeIdentity(root.resolve(), storage_id, label)


def _identity_error(exc: OSError, root: Path) -> OrbitError:
    if exc.errno in oserrors.DISK_FULL_ERRNOS:
        return DiskFull(f"{root}: {oserrors.reason(exc)} writing {IDENTITY_FILE}")
    if oserrors.is_path_error(exc):
        return InvalidInput(f"{root} cannot hold an archive volume: {oserrors.reason(exc)}")
    return ArchiveIOError(f"{root}: I/O error writing {IDENTITY_FILE}: {oserrors.reason(exc)}")


def _remove_empty_dirs(created: list[Path]) -> None:
    """Undo the directories a failed write created (deepest first); a non-empty one stays."""
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            return


def _existing_identity(root: Path, storage_id: bytes) -> VolumeIdentity:
    current = read_identity(root)
    if current.storage_id != storage_id:
        raise ConflictError(
            f"{root} already holds storage {current.storage_id.hex()}; refusing to overwrite"
        )
    return current


def job_dir(volume: Path, namespace_id: bytes, job_id: bytes) -> Path:
    """``<volume>/<namespace_hex>/<job_hex>/`` (SPEC §6)."""
    return volume / namespace_id.hex() / job_id.hex()


# --------------------------------------------------------------------------- job files


class ArchiveIOError(OrbitError):
    """An I/O error on the archive volume (job error code ``IO_ERROR``)."""


class DiskFull(ArchiveIOError):
    """No space (or quota) left on the archive volume (job error code ``DISK_FULL``)."""


class FileConflict(ArchiveIOError):
    """A job file exists under a content-addressed name but holds other bytes (corruption)."""


@dataclass(frozen=True)
class StoredFile:
    path: PurePath  # a folder's file, or an S3 object's key
    created: bool  # False: the name already existed with identical bytes; left untouched
    inode: int | None  # the inode now under the name (ours only when ``created``); S3: None
    data: bytes | None = None  # S3: the bytes, to put back a name confirmed meanwhile (step 6)


def _os_error(exc: OSError, what: str) -> ArchiveIOError:
    code = oserrors.errno_name(exc)
    if exc.errno in oserrors.DISK_FULL_ERRNOS:
        return DiskFull(f"no space left on the archive volume writing {what} ({code})")
    return ArchiveIOError(f"I/O error on {what} ({code})")


def _ensure_dir(directory: Path, created: list[Path] | None = None) -> None:
    """``mkdir -p`` that fsyncs every newly created directory entry into its parent. Appends each
    directory it created to ``created`` (outermost first) as it goes, so that a caller can undo
    them after a later failure."""
    missing: list[Path] = []
    cur = directory
    while not cur.is_dir():
        missing.append(cur)
        cur = cur.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        if created is not None:
            created.append(d)
        fsync_dir(d.parent)


def _write_temp(directory: Path, name: str, data: bytes) -> tuple[Path, int]:
    """Write ``data`` to a new unique temp file for ``name`` and ``fsync`` it; returns its path and
    inode. On any failure (open, a short or failed write, fsync, close) the temp file is removed
    before the error propagates."""
    tmp = _unique_tmp(directory, name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp, inode


def _unique_tmp(directory: Path, name: str) -> Path:
    return directory / f"{TMP_PREFIX}{name}.{os.getpid()}.{os.urandom(4).hex()}"


def check_chain_name(name: str, data: bytes) -> None:
    """``ValueError`` unless ``name`` is a chain file name carrying the SHA-256 of ``data``."""
    parsed = parse_name(name)
    if parsed is None or parsed.sha256 != sha256_hex(data):
        raise ValueError("job file name must be a chain name carrying the sha256 of its data")


def _discard(tmp: Path | None) -> None:
    """Remove a temp file a failed write left (if any)."""
    if tmp is not None:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def store_job_file(dirpath: Path, name: str, data: bytes) -> StoredFile:
    """Durably publish a chain file under its content-addressed ``name`` (see module docstring).

    ``ValueError`` if ``name`` is not a chain name or does not hash-match ``data``. On failure the
    temp file is removed; a name already published (only the directory sync failed) stays: it
    is unconfirmed, and removing it here could delete a file that a live claim has adopted and
    confirmed meanwhile. The lease-checked cleanup of the next claim removes it (SPEC §5).
    """
    check_chain_name(name, data)
    directory = Path(dirpath)
    try:
        _ensure_dir(directory)
    except OSError as exc:
        raise _os_error(exc, name) from None
    stored = _publish(directory, name, data)
    try:
        failpoints.hit("volume.before_dir_fsync")
        fsync_dir(directory)
    except OSError as exc:
        raise _os_error(exc, name) from None
    return stored


def store_named_file(dirpath: Path, name: str, data: bytes) -> StoredFile:
    """:func:`store_job_file` for a content-addressed file outside the chain whose name its
    caller checked (the id index of a job, issue 28): written, synced, linked under ``name``
    (an existing name with the same bytes is fine, other bytes are a ``FileConflict``), then
    the directory synced."""
    directory = Path(dirpath)
    try:
        _ensure_dir(directory)
    except OSError as exc:
        raise _os_error(exc, name) from None
    stored = _publish(directory, name, data)
    try:
        fsync_dir(directory)
    except OSError as exc:
        raise _os_error(exc, name) from None
    return stored


def store_job_files(
    dirpath: Path, files: Sequence[tuple[str, bytes]]
) -> tuple[list[StoredFile], ArchiveIOError | None]:
    """:func:`store_job_file` for several chain files in chain order, with ONE directory
    ``fsync`` after their publishes (group durability: every file is durable when this returns,
    each its own ``fsync`` before its ``link``). The temp files are written and synced in
    parallel (:func:`_write_temps`: the files' ``fsync`` calls overlap); their names are then
    published one after the other, in chain order. Stops at the first file that fails (in chain
    order) and returns the files stored before it and that error (the caller confirms those,
    then fails); the temp files of the files after it are removed, never published. The
    directory is synced whenever something was published. A failed directory sync raises: the
    names it published stay unconfirmed leftovers, as in :func:`store_job_file`."""
    directory = Path(dirpath)
    stored: list[StoredFile] = []
    error: ArchiveIOError | None = None
    for name, data in files:
        check_chain_name(name, data)
    try:
        _ensure_dir(directory)
    except OSError as exc:
        return [], _os_error(exc, files[0][0])
    temps = _write_temps(directory, files)
    try:
        for i, (name, data) in enumerate(files):
            try:
                stored.append(_publish_temp(directory, name, data, temps[i].result()))
            except ArchiveIOError as exc:
                error = exc
                break
            except OSError as exc:  # the temp write itself failed (already removed)
                error = _os_error(exc, name)
                break
    finally:
        for temp in temps[len(stored) :]:  # the failed one's and those never published
            with contextlib.suppress(OSError):  # a failed write removed its own temp file
                _discard(temp.result()[0])
    if stored:
        try:
            failpoints.hit("volume.before_dir_fsync")
            fsync_dir(directory)
        except OSError as exc:
            raise _os_error(exc, stored[-1].path.name) from None
    return stored, error


WRITE_THREADS = 4
"""Temp files of one group written and synced at once (``claims.GROUP_FILES``)."""

_writers: ThreadPoolExecutor | None = None
_writers_lock = threading.Lock()


def _writer_pool() -> ThreadPoolExecutor:
    """The process's pool of temp-file writers, started at first use (after a prefork pool's
    fork: a pool inherited through ``fork`` has no threads, see :func:`_forget_writers`)."""
    global _writers
    with _writers_lock:
        if _writers is None:
            _writers = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="archive-fsync")
        return _writers


def _forget_writers() -> None:
    global _writers, _writers_lock
    _writers, _writers_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_writers)


def _write_temps(
    directory: Path, files: Sequence[tuple[str, bytes]]
) -> list[Future[tuple[Path, int]]]:
    """Each file's temp file written and synced (:func:`_write_temp`), in parallel when there
    are several; the futures in the order of ``files``. A failed write has removed its temp
    file (its future holds the ``OSError``)."""
    if len(files) == 1:
        done: Future[tuple[Path, int]] = Future()
        try:
            done.set_result(_write_temp(directory, *files[0]))
        except OSError as exc:
            done.set_exception(exc)
        return [done]
    pool = _writer_pool()
    return [pool.submit(_write_temp, directory, name, data) for name, data in files]


def _publish(directory: Path, name: str, data: bytes) -> StoredFile:
    """Write, ``fsync`` and ``link`` one chain file (the directory is not synced here)."""
    try:
        temp = _write_temp(directory, name, data)
    except OSError as exc:
        raise _os_error(exc, name) from None
    return _publish_temp(directory, name, data, temp)


def _publish_temp(directory: Path, name: str, data: bytes, temp: tuple[Path, int]) -> StoredFile:
    """``link`` a written and synced temp file (``temp``: its path and inode) under its final
    name, then remove the temp name (also on failure)."""
    final = directory / name
    tmp: Path | None
    tmp, inode = temp
    try:
        failpoints.hit("volume.before_publish")
        created = True
        try:
            os.link(tmp, final)
        except FileExistsError:
            created = False
            with open(final, "rb") as fh:
                if fh.read() != data:
                    raise FileConflict(
                        f"{name} exists with other contents; left untouched"
                    ) from None
                inode = os.fstat(fh.fileno()).st_ino
        os.unlink(tmp)
        tmp = None
        return StoredFile(final, created, inode)
    except OSError as exc:
        raise _os_error(exc, name) from None
    finally:
        _discard(tmp)


def replace_job_file(dirpath: Path, name: str, data: bytes) -> bool:
    """Put the bytes of content-addressed chain file ``name`` back (``orbit job repair``): a
    missing name is published like :func:`store_job_file` (``link``: never replaces); a name
    holding other bytes -- read just before, so never a good file -- is replaced by a temp file
    (written, ``fsync``) renamed over it, then the directory is synced. False when ``name``
    already holds ``data``."""
    check_chain_name(name, data)
    directory = Path(dirpath)
    final = directory / name
    try:
        current = final.read_bytes()
    except FileNotFoundError:
        store_job_file(directory, name, data)
        return True
    except OSError as exc:
        raise _os_error(exc, name) from None
    if current == data:
        return False
    tmp: Path | None = None
    try:
        tmp, _ = _write_temp(directory, name, data)
        os.rename(tmp, final)
        tmp = None
        fsync_dir(directory)
    except OSError as exc:
        raise _os_error(exc, name) from None
    finally:
        _discard(tmp)
    return True


def write_job_file(dirpath: Path, name: str, data: bytes) -> Path:
    """:func:`store_job_file` returning just the path."""
    return Path(store_job_file(dirpath, name, data).path)


def list_job_files(dirpath: Path) -> list[tuple[str, ParsedName]]:
    """Chain files of a job directory in (seq, name) order; temp and foreign files are skipped.
    A missing directory lists as empty."""
    out = [(n, p) for n in list_names(dirpath) if (p := parse_name(n)) is not None]
    return sorted(out, key=lambda item: (item[1].seq, item[0]))


def list_all_names(dirpath: Path) -> list[str]:
    """Every name in a job directory (``.tmp-`` files too), sorted; missing directory -> []."""
    try:
        return sorted(os.listdir(dirpath))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _os_error(exc, "job directory") from None


def list_names(dirpath: Path) -> list[str]:
    """Every name in a job directory except ``.tmp-`` files, sorted; missing directory -> []."""
    try:
        names = os.listdir(dirpath)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _os_error(exc, "job directory") from None
    return sorted(n for n in names if not n.startswith(TMP_PREFIX))


def read_file(path: Path) -> bytes:
    """File bytes. ``FileNotFoundError`` passes through (callers name the missing file); any other
    OS error -> :class:`ArchiveIOError`."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _os_error(exc, Path(path).name) from None


def remove_beyond_prefix(
    dirpath: Path, confirmed_batches: int, *, last_sha256: str | None = None
) -> list[str]:
    """Remove leftovers of a dead claim: chain files with seq > ``confirmed_batches``, and stale
    ``.tmp-`` files. With ``last_sha256`` also other files at the tail position (seq ==
    ``confirmed_batches``) whose hash is not the confirmed one; ``last_sha256 == ""`` (nothing
    confirmed yet) removes every chain file, manifests included. Foreign names are left alone.
    Returns the removed names (sorted); fsyncs the directory when something was removed."""
    directory = Path(dirpath)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _os_error(exc, "job directory") from None
    doomed = []
    for name in names:
        p = parse_name(name)
        if name.startswith(TMP_PREFIX):
            doomed.append(name)
        elif p is None:
            continue
        else:
            unconfirmed = last_sha256 == "" or p.seq > confirmed_batches
            other_tail = bool(last_sha256) and p.seq == confirmed_batches
            if unconfirmed or (other_tail and p.sha256 != last_sha256):
                doomed.append(name)
    try:
        for name in doomed:
            (directory / name).unlink(missing_ok=True)
        if doomed:
            fsync_dir(directory)
    except OSError as exc:
        raise _os_error(exc, "job directory cleanup") from None
    return doomed


def remove_file_if_unconfirmed(
    dirpath: Path, name: str, confirmed_names: Collection[str], *, inode: int | None = None
) -> bool:
    """SPEC §5 step 6: a worker whose confirm was rejected removes the file it wrote unless that
    name is part of the confirmed chain. Pass ``inode`` (from :func:`store_job_file`, only when
    ``created``) to delete only that inode; without it the name is unlinked. Returns True if a
    file was removed."""
    if name in confirmed_names:
        return False
    directory = Path(dirpath)
    final = directory / name
    try:
        if inode is None:
            try:
                final.unlink()
            except FileNotFoundError:
                return False
            fsync_dir(directory)
            return True
        aside = _unique_tmp(directory, name)
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            return False
        removed = False
        try:
            failpoints.hit("volume.after_aside")
            removed = os.stat(aside).st_ino == inode
        finally:
            if not removed:
                # Someone else's file, or we could not tell: put it back, never replace. A
                # `.tmp-` name is what the next claim's cleanup deletes.
                with contextlib.suppress(FileExistsError):
                    os.link(aside, final)
            os.unlink(aside)
        fsync_dir(directory)
        return removed
    except OSError as exc:
        raise _os_error(exc, name) from None


def free_bytes(volume: Path) -> int:
    """Bytes available to unprivileged writers on the volume's filesystem."""
    st = os.statvfs(volume)
    return st.f_bavail * st.f_frsize
