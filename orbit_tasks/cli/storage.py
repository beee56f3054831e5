"""``orbit storage init|list``: archive volumes and their registry.

``storage init PATH`` makes PATH a volume (docs/decisions.md, "storage init"): in one database
transaction it inserts the registry row of a new storage id (UUIDv7), writes
``PATH/.orbit-volume.json`` durably, and only then commits. So a database that is down or
refuses, and a path that cannot hold a volume, leave nothing behind: no file, no temp file, no
directory, no row. A crash (or a lost commit) after the file leaves a file without a row, never a
registered storage without its file; the next ``storage init PATH`` registers that identity. On a
path that already holds an identity the command does not create a new one:

- identity registered in this database: prints it (idempotent, exit 0);
- identity not registered here (an operator re-attaching a volume, or the crash above):
  registers it and prints it (exit 0);
- ``--label`` given and different from the label in the file: exit 3 (you are probably looking
  at another disk than you think); unreadable or foreign identity file: exit 2.

A volume may not lie inside another volume (a parent directory holding an identity): exit 3,
because job directories of the two would overlap.

``storage init s3://BUCKET/PREFIX`` (issue 18, docs/decisions.md "S3 storages") does the same on
object storage: the registry row and the storage's location (endpoint, region, addressing
style, storage class, SSE; never a credential) are inserted, the identity object
``PREFIX/.orbit-volume.json`` is created with ``If-None-Match: *``, then the transaction
commits. An identity object that is there already is this database's storage (printed, exit
0), or refused (exit 3) -- another database's storage, or one whose registration was lost:
``--adopt`` registers it here on purpose. An identity under a parent prefix: exit 3.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path

import click
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from orbit_tasks import failpoints
from orbit_tasks.archive.engine.objects import S3Storage
from orbit_tasks.archive.engine.volume import IDENTITY_FILE, read_identity, write_identity
from orbit_tasks.archive.s3_locations import (
    SSE_MODES,
    STORAGE_CLASSES,
    S3Location,
    check_options,
    is_s3_url,
    parse_s3_url,
)
from orbit_tasks.archive.store.controls import PLATFORM_NAMESPACE
from orbit_tasks.cli.common import emit, emit_list, iso_utc, json_option
from orbit_tasks.cli.namespace import (
    ACTIVE_JOB_STATES,
    RETIRED_COLUMNS,
    checked_reason,
    retired_fields,
)
from orbit_tasks.cli.places import COMMAND_RETRY_SECONDS, refuse_s3_options
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.error_lines import describe_database_error
from orbit_tasks.errors import (
    ConflictError,
    IllegalState,
    InvalidInput,
    NotFound,
    OrbitError,
)
from orbit_tasks.ids import from_hex, is_hex_id, new_id
from orbit_tasks.platform import store
from orbit_tasks.platform.store import RetiredKind, Retirement
from orbit_tasks.settings import get_settings

MAX_LABEL = 128


@click.group("storage")
def storage_group() -> None:
    """Archive volumes (storages)."""


def _check_place(root: Path) -> None:
    """Refuse, before anything is written, a path that is or lies under a regular file."""
    if root.exists() and not root.is_dir():
        raise InvalidInput(f"{root} is not a directory")
    for parent in root.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidInput(f"{root} lies under {parent}, which is not a directory")
            return


def _enclosing_volume(root: Path) -> Path | None:
    for parent in root.parents:
        if (parent / IDENTITY_FILE).exists():
            return parent
    return None


def _create_volume(root: Path, storage_id: bytes, label: str) -> None:
    """Registry row (uncommitted), identity file, commit: see the module docstring."""
    with platform_engine().connect() as conn:
        trans = conn.begin()
        try:
            store.register_storage(conn, storage_id, label)  # down or refused: disk untouched
            write_identity(root, storage_id, label)
            failpoints.hit("storage.init.before_commit")
        except BaseException:
            with contextlib.suppress(Exception):
                trans.rollback()
            raise
        try:
            trans.commit()
        except DBAPIError as exc:
            # The commit's outcome is unknown: removing the file could orphan a committed row.
            raise OrbitError(
                f"{root}: the identity file of storage {storage_id.hex()} is written, but the "
                f"database did not confirm its registration ({describe_database_error(exc)}); "
                f"run `orbit storage init {root}` again to register it"
            ) from None


@storage_group.command("init")
@click.argument("path")
@click.option("--label", default=None, help=f"Human label (0..{MAX_LABEL} characters).")
@click.option("--endpoint", default="", help="s3://: the S3 endpoint URL (MinIO, Ceph, ...).")
@click.option("--region", default="", help="s3://: the bucket's region.")
@click.option("--path-style", is_flag=True, help="s3://: path-style addressing (MinIO).")
@click.option(
    "--storage-class",
    default="",
    help=f"s3://: the storage class of the objects ({', '.join(STORAGE_CLASSES)}).",
)
@click.option(
    "--sse", default="", help=f"s3://: server-side encryption ({', '.join(SSE_MODES[1:])})."
)
@click.option("--kms-key-id", default="", help="s3://: the KMS key of --sse aws:kms.")
@click.option("--adopt", is_flag=True, help="s3://: register an existing identity object here.")
@json_option
def storage_init(
    path: str,
    label: str | None,
    endpoint: str,
    region: str,
    path_style: bool,
    storage_class: str,
    sse: str,
    kms_key_id: str,
    adopt: bool,
    as_json: bool,
) -> None:
    """Make PATH (a folder or s3://BUCKET/PREFIX) an archive storage: write its identity and
    register it. Prints the id."""
    if label is not None and len(label) > MAX_LABEL:
        raise InvalidInput(f"--label is {len(label)} characters long (allowed 0..{MAX_LABEL})")
    refuse_s3_options(
        path, endpoint=endpoint, region=region, path_style=path_style,
        storage_class=storage_class, sse=sse, kms_key_id=kms_key_id, adopt=adopt,
    )  # fmt: skip
    if is_s3_url(path):
        bucket, prefix = parse_s3_url(path)
        loc = S3Location(
            bucket, prefix, endpoint.rstrip("/"), region, path_style, storage_class, sse,
            kms_key_id,
        )  # fmt: skip
        check_options(loc)
        _init_s3(loc, label, adopt, as_json)
        return
    root = Path(path).resolve()
    _check_place(root)
    outer = _enclosing_volume(root)
    if outer is not None:
        raise ConflictError(
            f"{root} lies inside the archive volume {outer} "
            f"(storage {read_identity(outer).storage_id.hex()}); volumes cannot nest"
        )
    if (root / IDENTITY_FILE).exists():
        ident = read_identity(root)
        if label is not None and label != ident.label:
            raise ConflictError(
                f"{root} already holds storage {ident.storage_id.hex()} labelled "
                f"{ident.label!r}, not {label!r}; refusing to create another identity"
            )
        with platform_engine().begin() as conn:
            registered = store.storage_exists(conn, ident.storage_id)
            if not registered:
                store.register_storage(conn, ident.storage_id, ident.label)
        storage_id, final_label = ident.storage_id, ident.label
        status = "existing" if registered else "registered"
    else:
        storage_id, final_label = new_id(), label or ""
        _create_volume(root, storage_id, final_label)
        status = "created"
    data = {
        "id": storage_id.hex(),
        "label": final_label,
        "path": str(root),
        "status": status,
    }
    if status != "created" and not as_json:
        click.echo(f"{root} already holds storage {storage_id.hex()} ({status})", err=True)
    emit(data, as_json, storage_id.hex())


def _init_s3(loc: S3Location, label: str | None, adopt: bool, as_json: bool) -> None:
    storage = S3Storage(loc, retry_seconds=COMMAND_RETRY_SECONDS)
    url = loc.url
    parts = loc.prefix.split("/") if loc.prefix else []
    for depth in range(len(parts)):  # the bucket's root and every parent prefix
        parent = "/".join(parts[:depth])
        if storage.has_identity(parent):
            outer = f"s3://{loc.bucket}/{parent}" if parent else f"s3://{loc.bucket}"
            raise ConflictError(
                f"{url} lies inside the archive storage {outer}; storages cannot nest"
            )
    try:
        ident = storage.identity()
    except InvalidInput as exc:
        if "no " + IDENTITY_FILE not in str(exc):
            raise  # unreadable or foreign: exit 2
        ident = None
    if ident is not None:
        if label is not None and label != ident.label:
            raise ConflictError(
                f"{url} already holds storage {ident.storage_id.hex()} labelled "
                f"{ident.label!r}, not {label!r}; refusing to create another identity"
            )
        with platform_engine().begin() as conn:
            registered = store.storage_exists(conn, ident.storage_id)
            if not registered and not adopt:
                raise ConflictError(
                    f"{url} already holds storage {ident.storage_id.hex()}, which is not "
                    "registered in this platform database (another database's storage?); "
                    "--adopt registers it here"
                )
            if not registered:
                store.register_storage(conn, ident.storage_id, ident.label)
            store.register_object_location(conn, ident.storage_id, asdict(loc))
        storage_id, final_label = ident.storage_id, ident.label
        status = "existing" if registered else "registered"
    else:
        storage_id, final_label = new_id(), label or ""
        _create_s3(storage, loc, storage_id, final_label)
        status = "created"
    if status != "created" and not as_json:
        click.echo(f"{url} already holds storage {storage_id.hex()} ({status})", err=True)
    data = {"id": storage_id.hex(), "label": final_label, "path": url, "status": status}
    emit(data, as_json, storage_id.hex())


def _create_s3(storage: S3Storage, loc: S3Location, storage_id: bytes, label: str) -> None:
    """Registry rows (uncommitted), identity object (only if absent), commit."""
    with platform_engine().connect() as conn:
        trans = conn.begin()
        try:
            store.register_storage(conn, storage_id, label)
            store.register_object_location(conn, storage_id, asdict(loc))
            storage.create_identity(storage_id, label)  # another's identity won: exit 3
            failpoints.hit("storage.init.before_commit")
        except BaseException:
            with contextlib.suppress(Exception):
                trans.rollback()
            raise
        try:
            trans.commit()
        except DBAPIError as exc:
            raise OrbitError(
                f"{loc.url}: the identity object of storage {storage_id.hex()} is written, but "
                f"the database did not confirm its registration ({describe_database_error(exc)}); "
                f"run `orbit storage init {loc.url} --adopt` with the same options to register it"
            ) from None


@storage_group.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also the retired storages.")
@json_option
def storage_list(show_all: bool, as_json: bool) -> None:
    """List registered storages (id, label, created_at, and an S3 storage's location); retired
    ones only with --all, which adds retired_at, retired_by and retired_reason."""
    with platform_engine().begin() as conn:
        retired = store.retirements_of(conn, RetiredKind.STORAGE) if show_all else {}
        rows = [
            {
                "id": s["storage_id"],
                "label": s["label"],
                "created_at": iso_utc(s["created_at"]),
                "location": _location(s),
                **(retired_fields(retired.get(from_hex(s["storage_id"]))) if show_all else {}),
            }  # fmt: skip
            for s in store.list_storages(conn, retired=show_all)
        ]
    columns = ["id", "label", "created_at", "location"]
    emit_list(rows, as_json, columns + (RETIRED_COLUMNS if show_all else []))


def _location(s: dict[str, object]) -> str:
    """``s3://bucket/prefix`` (and `` at ENDPOINT``) of an S3 storage; "" for a folder."""
    if s["bucket"] is None:
        return ""
    url = S3Location(str(s["bucket"]), str(s["prefix"])).url
    return f"{url} at {s['endpoint']}" if s["endpoint"] else url


# --- storage retire (issue 27; helper of its own, after the commands above) -------------------


@storage_group.command("retire")
@click.argument("storage")
@click.option("--reason", required=True, help="Why (1..500 characters, one line); recorded.")
@json_option
def storage_retire(storage: str, reason: str, as_json: bool) -> None:
    """Retire STORAGE (its id, or a label only one storage has): it leaves `storage list` (see
    --all), the metrics and the broker probe, and gets no new plans or jobs; its archives stay
    readable (job verify|export|restore, archive restore with --volume).

    Refused (exit 3) while enabled plans or PENDING, RUNNING or FAILED jobs are on it. Retiring a
    retired storage changes nothing (exit 0). Audited (archive.storage.retire). Nothing is
    written to the volume.
    """
    checked_reason(reason)
    actor = get_settings().operator
    with platform_engine().begin() as conn:
        storage_id, label = _storage_by_ref(conn, storage)
        now = db_now(conn)
        earlier = store.insert_retirement(
            conn, RetiredKind.STORAGE, storage_id, reason=reason, actor=actor, at=now
        )
        if earlier is None:
            found = store.holds(conn, storage_id=storage_id, active_states=ACTIVE_JOB_STATES)
            if found:
                raise IllegalState(
                    f"storage {storage_id.hex()} ({label!r}) cannot be retired: it holds "
                    f"{found.describe()}; disable the plans (`orbit plan set NS KIND --disable`) "
                    "and retry or abandon the jobs (`orbit job abandon NS JOB`) first"
                )
            store.insert_audit(
                conn,
                PLATFORM_NAMESPACE,
                actor=actor,
                action="archive.storage.retire",
                target_kind="archive_storage",
                target_id=storage_id.hex(),
                detail={"label": label, "reason": reason},
                at=now,
            )
    done = earlier or Retirement(RetiredKind.STORAGE, storage_id, reason, actor, now)
    data = {
        "id": storage_id.hex(),
        "label": label,
        "retired": earlier is None,
        **retired_fields(done),
    }
    human = (
        f"retired storage {storage_id.hex()} ({label!r})"
        if earlier is None
        else f"storage {storage_id.hex()} ({label!r}) was already retired at "
        f"{iso_utc(earlier.retired_at)} by {earlier.retired_by}; nothing changed"
    )
    emit(data, as_json, human)


def _storage_by_ref(conn: Connection, ref: str) -> tuple[bytes, str]:
    """A storage by its id (32 hex) or by a label only one storage has: (id, label). Exit 4
    when none matches, 2 when the label names several storages or is empty."""
    if not ref:
        raise InvalidInput("storage '' is invalid: give its id (32 hex) or its label")
    if is_hex_id(ref):
        label = store.storage_label(conn, from_hex(ref))
        if label is not None:
            return from_hex(ref), label
    found = store.storages_labelled(conn, ref)
    if not found:
        raise NotFound(
            f"storage {ref!r} is not registered: no storage has this id or label "
            "(see `orbit storage list --all`)"
        )
    if len(found) > 1:
        ids = ", ".join(s.hex() for s in found)
        raise InvalidInput(
            f"storage label {ref!r} names {len(found)} storages ({ids}); give the id of one"
        )
    return found[0], ref


def register(cli: click.Group) -> None:
    cli.add_command(storage_group)
