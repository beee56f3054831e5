"""Archive volumes on disk: the identity file, durable writes, job file listing and cleanup.

Durable write protocol (SPEC §5 step 4): write to a ``.tmp-`` name, ``fsync`` it, ``rename`` to the
final name, ``fsync`` the directory; only then may the database confirm the file.

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
import errno
import json
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from orbit_tasks.archive.fileformat import ParsedName, parse_name, sha256_hex
from orbit_tasks.errors import ConflictError, InvalidInput, OrbitError
from orbit_tasks.ids import from_hex

IDENTITY_FILE = ".orbit-volume.json"
VOLUME_FORMAT = "orbit-volume/1"
TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class VolumeIdentity:
    path: Path
    storage_id: bytes
    label: str


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_write(directory: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to ``directory/name`` crash-safely; returns the final path.

    The temp file lives in the same directory so that the rename is atomic on one filesystem.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / name
    tmp = directory / f"{TMP_PREFIX}{name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, final)
    fsync_dir(directory)
    return final


def read_identity(path: Path | str) -> VolumeIdentity:
    """Read and validate ``<path>/.orbit-volume.json``."""
    root = Path(path)
    ident = root / IDENTITY_FILE
    try:
        doc = json.loads(ident.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"{root} is not an archive volume (no {IDENTITY_FILE})") from None
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{ident} is unreadable: {type(exc).__name__}") from None
    if not isinstance(doc, dict) or doc.get("format") != VOLUME_FORMAT:
        raise InvalidInput(f"{ident} is not of format {VOLUME_FORMAT!r}")
    storage_id = from_hex(str(doc.get("storage_id", "")), "storage_id")
    return VolumeIdentity(root.resolve(), storage_id, str(doc.get("label", "")))


def write_identity(path: Path | str, storage_id: bytes, label: str) -> VolumeIdentity:
    """Write the identity file of a new volume. Refuses a path that names a different storage.

    The file is published with ``link()``, which never replaces an existing name: of two
    concurrent ``storage init`` runs on one path exactly one identity wins, and the loser reads
    it back (and is refused if it is not the one it meant to write).
    """
    root = Path(path)
    if (root / IDENTITY_FILE).exists():
        return _existing_identity(root, storage_id)
    root.mkdir(parents=True, exist_ok=True)
    doc = {"format": VOLUME_FORMAT, "label": label, "storage_id": storage_id.hex()}
    data = (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    tmp = root / f"{TMP_PREFIX}{IDENTITY_FILE}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, root / IDENTITY_FILE)
    except FileExistsError:
        return _existing_identity(root, storage_id)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(root)
    return VolumeIdentity(root.resolve(), storage_id, label)


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
    path: Path
    created: bool  # False: the name already existed with identical bytes; left untouched
    inode: int  # the inode now under the name (ours only when ``created``)


def _os_error(exc: OSError, what: str) -> ArchiveIOError:
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"no space left on the archive volume writing {what} ({code})")
    return ArchiveIOError(f"I/O error on {what} ({code})")


def _ensure_dir(directory: Path) -> None:
    """``mkdir -p`` that fsyncs every newly created directory entry into its parent."""
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
        fsync_dir(d.parent)


def _unique_tmp(directory: Path, name: str) -> Path:
    return directory / f"{TMP_PREFIX}{name}.{os.getpid()}.{os.urandom(4).hex()}"


def store_job_file(dirpath: Path, name: str, data: bytes) -> StoredFile:
    """Durably publish a chain file under its content-addressed ``name`` (see module docstring).

    ``ValueError`` if ``name`` is not a chain name or does not hash-match ``data``.
    """
    parsed = parse_name(name)
    if parsed is None or parsed.sha256 != sha256_hex(data):
        raise ValueError("job file name must be a chain name carrying the sha256 of its data")
    directory = Path(dirpath)
    final = directory / name
    tmp: Path | None = None
    try:
        _ensure_dir(directory)
        tmp = _unique_tmp(directory, name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
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
        fsync_dir(directory)
        return StoredFile(final, created, inode)
    except OSError as exc:
        raise _os_error(exc, name) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def write_job_file(dirpath: Path, name: str, data: bytes) -> Path:
    """:func:`store_job_file` returning just the path."""
    return store_job_file(dirpath, name, data).path


def list_job_files(dirpath: Path) -> list[tuple[str, ParsedName]]:
    """Chain files of a job directory in (seq, name) order; temp and foreign files are skipped.
    A missing directory lists as empty."""
    out = [(n, p) for n in list_names(dirpath) if (p := parse_name(n)) is not None]
    return sorted(out, key=lambda item: (item[1].seq, item[0]))


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
        removed = os.stat(aside).st_ino == inode
        if not removed:
            with contextlib.suppress(FileExistsError):
                os.link(aside, final)  # someone else's file: put it back, never replace
        os.unlink(aside)
        fsync_dir(directory)
        return removed
    except OSError as exc:
        raise _os_error(exc, name) from None


def free_bytes(volume: Path) -> int:
    """Bytes available to unprivileged writers on the volume's filesystem."""
    st = os.statvfs(volume)
    return st.f_bavail * st.f_frsize
