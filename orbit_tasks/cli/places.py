"""How a command resolves ``--volume``: a mounted folder, or ``s3://BUCKET/PREFIX`` -- an S3
storage registered by ``orbit storage init``, whose endpoint, region, addressing style and
write options come from the registry (``orbit_archive_object_storages``), so that a worker or a
reader needs only credentials (the standard AWS chain; issue 18)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection

from orbit_tasks.archive.engine.storage import JobFiles, Storage, open_storage
from orbit_tasks.archive.engine.volume import VolumeIdentity
from orbit_tasks.archive.jobs import Job
from orbit_tasks.archive.s3_locations import S3Location, is_s3_url, parse_s3_url
from orbit_tasks.errors import ConflictError, InvalidInput, NotFound
from orbit_tasks.ids import from_hex, is_hex_id
from orbit_tasks.platform import store

#: How long a command retries an unanswered object store before it gives up (exit 1).
COMMAND_RETRY_SECONDS = 10.0


@dataclass(frozen=True)
class OpenedPlace:
    """A ``--volume`` opened and its identity read."""

    given: str
    place: Path | S3Location  # what a worker is handed (ORBIT_ARCHIVE_VOLUMES)
    storage: Storage
    identity: VolumeIdentity

    @property
    def where(self) -> str:
        """The resolved folder, or the s3:// URL."""
        return self.storage.where if isinstance(self.place, S3Location) else str(self.place)

    def job(self, j: Job) -> JobFiles:
        """Job ``j``'s directory here; exit 2 when ``j`` belongs to another storage."""
        if self.identity.storage_id != j.storage_id:
            raise InvalidInput(
                f"--volume {self.given} holds storage {self.identity.storage_id.hex()}, but job "
                f"{j.id.hex()} belongs to storage {j.storage_id.hex()}"
            )
        return self.storage.job(j.namespace_id, j.id)


def location_of(doc: dict[str, object]) -> S3Location:
    """An :class:`S3Location` from a registry row (``platform.store.object_location``)."""
    return S3Location(**{k: doc[k] for k in store.OBJECT_LOCATION_FIELDS})  # type: ignore[arg-type]


def registered_location(conn: Connection, url: str) -> tuple[bytes, S3Location]:
    """The registered S3 storage at ``url`` (exit 4 when none is, exit 3 when several are: a
    pair registered under two endpoints before issue 27, reached by the storages' ids)."""
    bucket, prefix = parse_s3_url(url)
    found = store.object_locations(conn, bucket, prefix)
    if not found:
        raise NotFound(
            f"{url} is not a storage registered in this platform database: check the bucket, "
            "the prefix and ORBIT_DATABASE_URL against orbit storage list"
        )
    if len(found) > 1:
        pairs = ", ".join(f"{d['storage_id']} at {str(d['endpoint']) or 'AWS'}" for d in found)
        raise ConflictError(
            f"{url} is registered on several endpoints (storage {pairs}): give --volume the "
            "id of the storage you mean"
        )
    doc = found[0]
    return bytes.fromhex(str(doc["storage_id"])), location_of(doc)


def registered_by_id(conn: Connection, given: str) -> tuple[bytes, S3Location] | None:
    """``--volume STORAGE_ID``: the registered S3 storage of that id, or None when ``given`` is
    not one (then it is a folder's path, as before; issue 27)."""
    if not is_hex_id(given) or Path(given).exists():
        return None
    storage_id = from_hex(given)
    doc = store.object_location(conn, storage_id)
    if doc is not None:
        return storage_id, location_of(doc)
    if store.storage_exists(conn, storage_id):
        raise InvalidInput(
            f"--volume {given} is a folder storage: give the folder where its volume is mounted"
        )
    return None


def _end_read(conn: Connection) -> None:
    """The registry reads are done: end their transaction before the storage I/O that follows.
    An S3 answer slower than the server's idle-transaction bound (a quarter of the lease) would
    otherwise close the session, and the command's next query would fail (2006). Every caller
    only reads before this point."""
    if conn.in_transaction() and not conn.in_nested_transaction():
        conn.commit()


def open_place(
    conn: Connection, given: str, *, retry_seconds: float = COMMAND_RETRY_SECONDS
) -> OpenedPlace:
    """Open a ``--volume`` and read its identity (exit 2 when a folder is not a volume or an
    identity is unreadable; an S3 identity must be the registered storage's, exit 3). An S3
    storage is named by its URL or by its id."""
    by_id = registered_by_id(conn, given)
    if by_id is not None or is_s3_url(given):
        storage_id, loc = by_id or registered_location(conn, given)
        _end_read(conn)
        storage = open_storage(loc, retry_seconds=retry_seconds)
        ident = storage.identity()
        if ident.storage_id != storage_id:
            raise ConflictError(
                f"{loc.url} holds storage {ident.storage_id.hex()}, but this database registered "
                f"storage {storage_id.hex()} there: check the endpoint and the bucket "
                "(docs/operations.md, STORAGE_MISMATCH)"
            )
        return OpenedPlace(given, loc, storage, ident)
    storage = open_storage(Path(given))
    ident = storage.identity()
    return OpenedPlace(given, Path(ident.path), storage, ident)


def refuse_s3_options(given: str, **options: object) -> None:
    """The S3 options of ``storage init`` are refused with a folder."""
    used = [name for name, value in options.items() if value]
    if used and not is_s3_url(given):
        flags = ", ".join("--" + n.replace("_", "-") for n in used)
        raise InvalidInput(f"{flags} only apply to an s3:// storage, not to the folder {given}")
