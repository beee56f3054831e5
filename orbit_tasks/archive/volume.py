"""Archive volumes on disk: the identity file and durable writes.

Durable write protocol (DEVELOPERS.md): write to a ``.tmp-`` name, ``fsync`` it, ``rename`` to the
final name, ``fsync`` the directory; only then may the database confirm the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from orbit_tasks.errors import ConflictError, InvalidInput
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
    """Write the identity file of a new volume. Refuses a path that names a different storage."""
    root = Path(path)
    existing = root / IDENTITY_FILE
    if existing.exists():
        current = read_identity(root)
        if current.storage_id != storage_id:
            raise ConflictError(
                f"{root} already holds storage {current.storage_id.hex()}; refusing to overwrite"
            )
        return current
    root.mkdir(parents=True, exist_ok=True)
    doc = {"format": VOLUME_FORMAT, "label": label, "storage_id": storage_id.hex()}
    data = (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    durable_write(root, IDENTITY_FILE, data)
    return VolumeIdentity(root.resolve(), storage_id, label)


def job_dir(volume: Path, namespace_id: bytes, job_id: bytes) -> Path:
    """``<volume>/<namespace_hex>/<job_hex>/`` (SPEC §6)."""
    return volume / namespace_id.hex() / job_id.hex()
