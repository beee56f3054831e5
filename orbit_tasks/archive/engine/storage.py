"""Where a storage's files live: a folder (a mounted volume) or an S3 bucket prefix, behind one
seam that the runner, the leftovers, the verifier and restore use (issue 18).

:class:`Storage` is a storage root (its identity and its job directories), :class:`JobFiles`
one job's directory on it. :class:`FolderStorage` / :class:`FolderJob` are the volume code of
:mod:`volume` (the durable ``link`` publish, the inode-fenced removal); the S3 implementation
is :mod:`objects`. :func:`open_storage` turns what a worker or a command was given -- a path,
an :class:`~orbit_tasks.archive.s3_locations.S3Location` or an existing storage -- into one.

The guarantees are the same on both (SPEC §5, docs/archive-jobs.md "Object storage"): a file
is durable under its final content-addressed name before its confirm, an existing name is never
replaced, a job directory is listed only on a takeover and at the final step.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from orbit_tasks.archive.engine import volume
from orbit_tasks.archive.engine.objects import S3Storage
from orbit_tasks.archive.engine.volume import StoredFile, VolumeIdentity
from orbit_tasks.archive.s3_locations import S3Location, location_from_json
from orbit_tasks.errors import InvalidInput
from orbit_tasks.ids import from_hex


@runtime_checkable
class JobFiles(Protocol):
    """One job's directory (``<ns_hex>/<job_hex>/``) on a storage."""

    @property
    def where(self) -> str:
        """The directory for messages: a path, or ``s3://bucket/prefix/ns/job``."""
        ...

    def exists(self) -> bool:
        """The directory holds (or is) something: a folder exists, a prefix has a key."""
        ...

    def names(self) -> list[str]:
        """Every name in the directory (``.tmp-`` files too), sorted; missing -> []."""
        ...

    def read(self, name: str) -> bytes:
        """A file's bytes: ``FileNotFoundError`` when missing, ``ArchiveIOError`` otherwise."""
        ...

    def store(self, name: str, data: bytes) -> StoredFile:
        """Durably publish a content-addressed chain file; never replaces an existing name."""
        ...

    def remove(self, names: Collection[str]) -> None:
        """Remove leftovers (a missing name is fine); ``OSError``/``ArchiveIOError`` else."""
        ...

    def replace_damaged(self, name: str, data: bytes) -> bool:
        """Put a rebuilt chain file back (``orbit job repair``): a missing name is published as
        by :meth:`store`, a name holding other bytes (read just before) is replaced; False when
        the name holds ``data`` already."""
        ...

    def remove_if_unconfirmed(
        self, name: str, confirmed: Collection[str], stored: StoredFile
    ) -> bool:
        """SPEC §5 step 6: remove the file this writer stored unless ``name`` is confirmed."""
        ...


@runtime_checkable
class Storage(Protocol):
    """A storage root: its identity and its job directories."""

    @property
    def where(self) -> str: ...

    def identity(self) -> VolumeIdentity:
        """Read and validate the identity (``InvalidInput`` when missing or foreign)."""
        ...

    def identity_stamp(self) -> Hashable:
        """A cheap token that changes when the identity may have changed (``OSError`` when it
        is gone)."""
        ...

    def create_identity(self, storage_id: bytes, label: str) -> VolumeIdentity:
        """Write the identity of a new storage, only if absent (``ConflictError`` when another
        storage's is there)."""
        ...

    def job(self, namespace_id: bytes, job_id: bytes) -> JobFiles: ...


# --------------------------------------------------------------------------- folders


class FolderJob:
    """A job directory on a mounted volume (the functions of :mod:`volume`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    @property
    def where(self) -> str:
        return str(self.directory)

    def exists(self) -> bool:
        return self.directory.is_dir()

    def names(self) -> list[str]:
        return volume.list_all_names(self.directory)

    def read(self, name: str) -> bytes:
        return volume.read_file(self.directory / name)

    def store(self, name: str, data: bytes) -> StoredFile:
        return volume.store_job_file(self.directory, name, data)

    def store_group(
        self, files: Sequence[tuple[str, bytes]]
    ) -> tuple[list[StoredFile], Exception | None]:
        return volume.store_job_files(self.directory, files)

    def remove(self, names: Collection[str]) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (self.directory / name).unlink()
        volume.fsync_dir(self.directory)

    def replace_damaged(self, name: str, data: bytes) -> bool:
        return volume.replace_job_file(self.directory, name, data)

    def remove_if_unconfirmed(
        self, name: str, confirmed: Collection[str], stored: StoredFile
    ) -> bool:
        return volume.remove_file_if_unconfirmed(
            self.directory, name, confirmed, inode=stored.inode
        )


class FolderStorage:
    """A mounted volume: ``<root>/.orbit-volume.json`` and ``<root>/<ns_hex>/<job_hex>/``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def where(self) -> str:
        return str(self.root)

    def identity(self) -> VolumeIdentity:
        return volume.read_identity(self.root)

    def identity_stamp(self) -> Hashable:
        # another disk mounted there has another device and inode; a rewritten file another
        # inode or mtime
        st = os.stat(self.root / volume.IDENTITY_FILE)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def create_identity(self, storage_id: bytes, label: str) -> VolumeIdentity:
        return volume.write_identity(self.root, storage_id, label)

    def job(self, namespace_id: bytes, job_id: bytes) -> FolderJob:
        return FolderJob(volume.job_dir(self.root, namespace_id, job_id))


def store_files(
    directory: JobFiles, files: Sequence[tuple[str, bytes]]
) -> tuple[list[StoredFile], Exception | None]:
    """Durably publish several chain files in chain order (group durability, SPEC §5 step 4):
    on a folder each file is written and synced, then ONE directory ``fsync`` covers their
    names (:func:`volume.store_job_files`); elsewhere (an S3 prefix: every PUT is durable by
    itself) one :meth:`JobFiles.store` each. Stops at the first failure: returns the files
    stored before it and the error, which the runner raises once it has confirmed those."""
    if isinstance(directory, FolderJob):
        return directory.store_group(files)
    stored: list[StoredFile] = []
    for name, data in files:
        try:
            stored.append(directory.store(name, data))
        except Exception as exc:  # raised by the runner after the confirm of ``stored``
            return stored, exc
    return stored, None


Place = Path | S3Location | Storage
"""What a worker or a command is given for a storage: a folder, an S3 location, or one open."""


def open_storage(place: Place | str, *, retry_seconds: float = 20.0) -> Storage:
    """A storage from a folder path, an S3 location (each request retried for at most
    ``retry_seconds``), or a storage already."""
    if isinstance(place, S3Location):
        return S3Storage(place, retry_seconds=retry_seconds)
    if isinstance(place, (str, Path)):
        return FolderStorage(Path(place))
    return place


def parse_volumes(raw: str | None) -> dict[str, Path | S3Location]:
    """``ORBIT_ARCHIVE_VOLUMES`` = JSON object ``{storage_hex: absolute_path}``; an S3 storage's
    value is ``{"s3": {...}}`` (its :class:`S3Location`)."""
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        raise InvalidInput("ORBIT_ARCHIVE_VOLUMES is not a JSON object") from None
    if not isinstance(doc, dict):
        raise InvalidInput("ORBIT_ARCHIVE_VOLUMES is not a JSON object")
    return {
        from_hex(str(k), "storage id").hex(): (
            location_from_json(v) if isinstance(v, dict) else Path(str(v))
        )
        for k, v in doc.items()
    }


def volumes_env(places: Mapping[str, Path | S3Location]) -> str:
    """The value of ``ORBIT_ARCHIVE_VOLUMES`` for ``{storage_hex: place}``."""
    doc = {k: (v.to_json() if isinstance(v, S3Location) else str(v)) for k, v in places.items()}
    return json.dumps(doc, sort_keys=True)


def job_files(place: Path | JobFiles) -> JobFiles:
    """A job directory: a folder path (the callers of the verifier before issue 18) or one
    already opened."""
    if isinstance(place, Path):
        return FolderJob(place)
    return place
