"""Every SQL statement on the platform's own registry tables: namespaces, storages, retention
policies, queues, credentials and the audit log. Functions take a ``Connection`` inside the
caller's transaction, so that a check and the write it guards commit together."""

from __future__ import annotations

import enum
import hashlib
import json
import re
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, insert, select, true, update
from sqlalchemy.exc import IntegrityError

from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import (
    archive_jobs,
    archive_object_storages,
    archive_plans,
    archive_policies,
    archive_storages,
    credentials,
    namespaces,
    queues,
    retirements,
)
from orbit_tasks.errors import ConflictError, IllegalState, InvalidInput, NotFound
from orbit_tasks.ids import from_hex, is_hex_id, new_id
from orbit_tasks.platform.history import history_kind

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
MIN_ARCHIVE_AFTER = 3600
MAX_ARCHIVE_AFTER = 100 * 365 * 86400
TOKEN_PREFIX = "orb_"


@dataclass(frozen=True)
class Namespace:
    id: bytes
    name: str
    state: str
    created_at: datetime


@dataclass(frozen=True)
class Policy:
    namespace_id: bytes
    kind: str
    revision: int
    archive_after_seconds: int
    created_at: datetime
    created_by: str


@dataclass(frozen=True)
class Queue:
    namespace_id: bytes
    id: bytes
    name: str


@dataclass(frozen=True)
class Credential:
    id: bytes
    namespace_id: bytes
    queue_ids: tuple[bytes, ...] | None  # None = every queue of the namespace
    label: str


def validate_name(name: str, what: str) -> str:
    """Namespace and queue names: 1-64 of ``a-z 0-9 _ . -``, and never 32 hexadecimal characters,
    which commands read as an id (SPEC §9: NS and queue arguments take a name or an id), so such a
    name could impersonate another namespace's id or never be addressed at all."""
    if not _NAME.match(name or ""):
        raise InvalidInput(
            f"{what} name {name!r} is invalid (allowed: 1-64 characters a-z 0-9 _ . -, "
            "starting with a letter or digit)"
        )
    if is_hex_id(name):
        raise InvalidInput(
            f"{what} name {name!r} is invalid: 32 hexadecimal characters are read as an id "
            f"wherever a {what} is named (allowed: 1-64 characters a-z 0-9 _ . -, not 32 hex)"
        )
    return name


# --- namespaces ---------------------------------------------------------------------------------


def create_namespace(conn: Connection, name: str) -> bytes:
    validate_name(name, "namespace")
    if conn.execute(select(namespaces.c.id).where(namespaces.c.name == name)).first():
        raise ConflictError(f"namespace {name!r} already exists")
    ns_id = new_id()
    try:
        conn.execute(insert(namespaces).values(id=ns_id, name=name, state="ACTIVE"))
    except IntegrityError:
        raise ConflictError(f"namespace {name!r} already exists") from None
    return ns_id


def list_namespaces(conn: Connection, *, retired: bool = True) -> list[Namespace]:
    """Every namespace by name; ``retired=False`` leaves the retired ones out."""
    query = select(namespaces).order_by(namespaces.c.name)
    if not retired:
        query = query.where(namespaces.c.id.not_in(retired_ids_query(RetiredKind.NAMESPACE)))
    rows = conn.execute(query).all()
    return [Namespace(r.id, r.name, r.state, r.created_at) for r in rows]


def resolve_namespace(conn: Connection, ref: str) -> Namespace:
    """A namespace by name or 32-hex id (SPEC §9: NS accepts either)."""
    cond = namespaces.c.id == from_hex(ref) if is_hex_id(ref) else namespaces.c.name == ref
    row = conn.execute(select(namespaces).where(cond)).first()
    if row is None and is_hex_id(ref):  # a 32-hex *name* from before names were checked
        row = conn.execute(select(namespaces).where(namespaces.c.name == ref)).first()
    if row is None:
        raise NotFound(f"namespace {ref!r} does not exist")
    return Namespace(row.id, row.name, row.state, row.created_at)


def get_namespace(conn: Connection, ns_id: bytes) -> Namespace | None:
    row = conn.execute(select(namespaces).where(namespaces.c.id == ns_id)).first()
    return None if row is None else Namespace(row.id, row.name, row.state, row.created_at)


def require_active_namespace(conn: Connection, ns_id: bytes) -> Namespace:
    """Checked inside the caller's transaction ("verified by the transaction")."""
    ns = get_namespace(conn, ns_id)
    if ns is None:
        raise NotFound(f"namespace {ns_id.hex()} does not exist")
    if ns.state != "ACTIVE":
        raise IllegalState(f"namespace {ns.name!r} is {ns.state}, not ACTIVE")
    return ns


def set_namespace_state(conn: Connection, ns_id: bytes, state: str) -> None:
    if state not in ("ACTIVE", "DISABLED"):
        raise InvalidInput(f"namespace state {state!r} is invalid (allowed: ACTIVE, DISABLED)")
    conn.execute(update(namespaces).where(namespaces.c.id == ns_id).values(state=state))


# --- storages -----------------------------------------------------------------------------------


def register_storage(conn: Connection, storage_id: bytes, label: str) -> None:
    if len(label) > 128:
        raise InvalidInput(f"label is {len(label)} characters long (allowed 0..128)")
    if storage_exists(conn, storage_id):
        return  # re-registering the same identity is a no-op
    try:
        conn.execute(insert(archive_storages).values(storage_id=storage_id, label=label))
    except IntegrityError:
        if storage_exists(conn, storage_id):
            return  # another `storage init` of the same volume registered it meanwhile
        raise


def storage_label(conn: Connection, storage_id: bytes) -> str | None:
    """The storage's label, or None when it is not registered."""
    row = conn.execute(
        select(archive_storages.c.label).where(archive_storages.c.storage_id == storage_id)
    ).first()
    return None if row is None else str(row.label)


def storages_labelled(conn: Connection, label: str) -> list[bytes]:
    """The storages whose label is ``label`` (labels are free text, not unique), oldest first."""
    s = archive_storages.c
    rows = conn.execute(select(s.storage_id).where(s.label == label).order_by(s.created_at))
    return [bytes(r.storage_id) for r in rows]


def storage_exists(conn: Connection, storage_id: bytes) -> bool:
    return (
        conn.execute(
            select(archive_storages.c.storage_id).where(archive_storages.c.storage_id == storage_id)
        ).first()
        is not None
    )


def list_storages(conn: Connection, *, retired: bool = True) -> list[dict[str, Any]]:
    """Every storage, oldest first; an S3 storage with its ``bucket``, ``prefix`` and
    ``endpoint`` (``None`` for a folder, whose path the database does not record).
    ``retired=False`` leaves the retired ones out."""
    s, o = archive_storages, archive_object_storages
    query = (
        select(s, o.c.bucket, o.c.prefix, o.c.endpoint)
        .select_from(s.outerjoin(o, o.c.storage_id == s.c.storage_id))
        .order_by(s.c.created_at)
    )
    if not retired:
        query = query.where(s.c.storage_id.not_in(retired_ids_query(RetiredKind.STORAGE)))
    rows = conn.execute(query).all()
    return [
        {
            "storage_id": r.storage_id.hex(),
            "label": r.label,
            "created_at": r.created_at,
            "bucket": r.bucket,
            "prefix": r.prefix,
            "endpoint": r.endpoint,
        }  # fmt: skip
        for r in rows
    ]


#: The columns of an S3 storage's location (``orbit_archive_object_storages``), the fields of
#: ``archive.s3_locations.S3Location``.
OBJECT_LOCATION_FIELDS = (
    "bucket", "prefix", "endpoint", "region", "path_style", "storage_class", "sse", "kms_key_id",
)  # fmt: skip


def register_object_location(conn: Connection, storage_id: bytes, location: dict[str, Any]) -> None:
    """Record where an S3 storage lives (issue 18), with its registry row; a second
    registration of the same storage keeps the first location."""
    if object_location(conn, storage_id) is not None:
        return
    values = {k: location[k] for k in OBJECT_LOCATION_FIELDS}
    try:
        conn.execute(insert(archive_object_storages).values(storage_id=storage_id, **values))
    except IntegrityError:
        if object_location(conn, storage_id) is not None:
            return
        raise


def object_location(conn: Connection, storage_id: bytes) -> dict[str, Any] | None:
    row = conn.execute(
        select(archive_object_storages).where(archive_object_storages.c.storage_id == storage_id)
    ).first()
    return None if row is None else _location(row)


def object_locations(conn: Connection, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """The registered S3 storages at ``s3://bucket/prefix`` (on any endpoint), oldest first;
    each with its ``storage_id`` (hex)."""
    t = archive_object_storages
    rows = conn.execute(
        select(t).where(t.c.bucket == bucket, t.c.prefix == prefix).order_by(t.c.created_at)
    ).all()
    return [_location(r) for r in rows]


def _location(row: Any) -> dict[str, Any]:
    doc = {k: getattr(row, k) for k in OBJECT_LOCATION_FIELDS}
    doc["path_style"] = bool(doc["path_style"])
    doc["storage_id"] = row.storage_id.hex()
    return doc


# --- retention policies (append-only revisions) -------------------------------------------------


def add_policy_revision(
    conn: Connection, ns_id: bytes, kind: str, archive_after_seconds: int, actor: str
) -> int:
    history_kind(kind)
    if not MIN_ARCHIVE_AFTER <= archive_after_seconds <= MAX_ARCHIVE_AFTER:
        raise InvalidInput(
            f"{{archive_after_seconds}} {archive_after_seconds}s is out of range "
            f"(allowed {MIN_ARCHIVE_AFTER}s (1h)..{MAX_ARCHIVE_AFTER}s)",
            fields=("archive_after_seconds",),
        )
    require_active_namespace(conn, ns_id)
    current = conn.execute(
        select(func.max(archive_policies.c.revision)).where(
            archive_policies.c.namespace_id == ns_id, archive_policies.c.kind == kind
        )
    ).scalar()
    revision = int(current or 0) + 1
    try:
        conn.execute(
            insert(archive_policies).values(
                namespace_id=ns_id,
                kind=kind,
                revision=revision,
                archive_after_seconds=archive_after_seconds,
                created_by=actor[:128],
            )
        )
    except IntegrityError:
        raise ConflictError(
            f"policy of {kind!r} changed concurrently (revision {revision} taken); retry"
        ) from None
    return revision


def _policy(row: Any) -> Policy:
    return Policy(
        row.namespace_id,
        row.kind,
        int(row.revision),
        int(row.archive_after_seconds),
        row.created_at,
        row.created_by,
    )


def latest_policy(conn: Connection, ns_id: bytes, kind: str) -> Policy | None:
    row = conn.execute(
        select(archive_policies)
        .where(archive_policies.c.namespace_id == ns_id, archive_policies.c.kind == kind)
        .order_by(archive_policies.c.revision.desc())
        .limit(1)
    ).first()
    return None if row is None else _policy(row)


def get_policy(conn: Connection, ns_id: bytes, kind: str, revision: int) -> Policy | None:
    row = conn.execute(
        select(archive_policies).where(
            archive_policies.c.namespace_id == ns_id,
            archive_policies.c.kind == kind,
            archive_policies.c.revision == revision,
        )
    ).first()
    return None if row is None else _policy(row)


def list_policies(conn: Connection, ns_id: bytes, kind: str | None = None) -> list[Policy]:
    """Every revision of the namespace's policies (of one kind), oldest first per kind."""
    cond = [archive_policies.c.namespace_id == ns_id]
    if kind is not None:
        cond.append(archive_policies.c.kind == kind)
    rows = conn.execute(
        select(archive_policies)
        .where(*cond)
        .order_by(archive_policies.c.kind, archive_policies.c.revision)
    ).all()
    return [_policy(r) for r in rows]


# --- queues and credentials ---------------------------------------------------------------------


def create_queue(conn: Connection, ns_id: bytes, name: str) -> bytes:
    validate_name(name, "queue")
    require_active_namespace(conn, ns_id)
    if conn.execute(
        select(queues.c.id).where(queues.c.namespace_id == ns_id, queues.c.name == name)
    ).first():
        raise ConflictError(f"queue {name!r} already exists in this namespace")
    queue_id = new_id()
    conn.execute(insert(queues).values(namespace_id=ns_id, id=queue_id, name=name))
    return queue_id


def list_queues(conn: Connection, ns_id: bytes) -> list[Queue]:
    rows = conn.execute(
        select(queues).where(queues.c.namespace_id == ns_id).order_by(queues.c.name)
    ).all()
    return [Queue(r.namespace_id, r.id, r.name) for r in rows]


def resolve_queue(conn: Connection, ns_id: bytes, ref: str) -> Queue:
    """A queue of ``ns_id`` by name or hex id."""
    cond = queues.c.id == from_hex(ref) if is_hex_id(ref) else queues.c.name == ref
    row = conn.execute(select(queues).where(queues.c.namespace_id == ns_id, cond)).first()
    if row is None:
        raise NotFound(f"queue {ref!r} does not exist in this namespace")
    return Queue(row.namespace_id, row.id, row.name)


def get_queue(conn: Connection, ns_id: bytes, queue_id: bytes) -> Queue | None:
    row = conn.execute(
        select(queues).where(queues.c.namespace_id == ns_id, queues.c.id == queue_id)
    ).first()
    return None if row is None else Queue(row.namespace_id, row.id, row.name)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_credential(
    conn: Connection, ns_id: bytes, queue_refs: list[str] | None, label: str = ""
) -> tuple[bytes, str]:
    """Create an API token bound to ``ns_id`` (and a queue allow-list). Returns (id, token);
    the token is shown once and only its SHA-256 is stored."""
    require_active_namespace(conn, ns_id)
    queue_ids: list[str] | None = None
    if queue_refs is not None:
        queue_ids = sorted({resolve_queue(conn, ns_id, q).id.hex() for q in queue_refs})
    cred_id = new_id()
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        insert(credentials).values(
            id=cred_id,
            namespace_id=ns_id,
            token_sha256=token_digest(token),
            queue_ids=None if queue_ids is None else json.dumps(queue_ids),
            label=label[:128],
        )
    )
    return cred_id, token


def lookup_credential(conn: Connection, token: str) -> Credential | None:
    """The active credential of ``token``, or None (unknown or revoked)."""
    row = conn.execute(
        select(credentials).where(
            credentials.c.token_sha256 == token_digest(token), credentials.c.revoked_at.is_(None)
        )
    ).first()
    if row is None:
        return None
    ids = (
        None
        if row.queue_ids is None
        else tuple(bytes.fromhex(q) for q in json.loads(row.queue_ids))
    )
    return Credential(row.id, row.namespace_id, ids, row.label)


def revoke_credential(conn: Connection, cred_id: bytes, now: datetime) -> None:
    result = conn.execute(
        update(credentials)
        .where(credentials.c.id == cred_id, credentials.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    if result.rowcount != 1:
        raise NotFound(f"credential {cred_id.hex()} does not exist or is already revoked")


def credential_namespace(conn: Connection, cred_id: bytes) -> bytes | None:
    """The namespace a credential belongs to (revoked or not), or None if it does not exist."""
    row = conn.execute(
        select(credentials.c.namespace_id).where(credentials.c.id == cred_id)
    ).first()
    return None if row is None else bytes(row.namespace_id)


def list_credentials(conn: Connection, ns_id: bytes) -> list[dict[str, Any]]:
    """Credentials of a namespace (never the token: only its id, label, queues and dates)."""
    rows = conn.execute(
        select(
            credentials.c.id,
            credentials.c.label,
            credentials.c.queue_ids,
            credentials.c.created_at,
            credentials.c.revoked_at,
        )
        .where(credentials.c.namespace_id == ns_id)
        .order_by(credentials.c.created_at, credentials.c.id)
    ).all()
    return [
        {
            "id": r.id.hex(),
            "label": r.label,
            "queues": None if r.queue_ids is None else json.loads(r.queue_ids),
            "created_at": r.created_at,
            "revoked_at": r.revoked_at,
        }
        for r in rows
    ]


# --- audit log ----------------------------------------------------------------------------------


def insert_audit(
    conn: Connection,
    ns_id: bytes,
    *,
    actor: str,
    action: str,
    target_kind: str,
    target_id: str,
    detail: dict[str, Any],
    at: datetime | None = None,
) -> bytes:
    """One audit row in the caller's transaction. ``detail`` holds ids, states and numbers only."""
    audit_id = new_id()
    values: dict[str, Any] = dict(
        namespace_id=ns_id,
        id=audit_id,
        actor=actor[:128],
        action=action[:64],
        target_kind=target_kind[:32],
        target_id=target_id[:64],
        detail_json=json.dumps(detail, sort_keys=True, separators=(",", ":"), default=str),
    )
    if at is not None:
        values["created_at"] = at
    conn.execute(insert(audit_events).values(**values))
    return audit_id


# --- retirements (issue 27, docs/operations.md "Retiring a storage or a namespace") ------------


class RetiredKind(enum.StrEnum):
    """What ``orbit_retirements.target_kind`` names."""

    STORAGE = "storage"
    NAMESPACE = "namespace"


@dataclass(frozen=True)
class Retirement:
    """One row of ``orbit_retirements``: who retired what, when and why."""

    kind: RetiredKind
    target_id: bytes
    reason: str
    retired_by: str
    retired_at: datetime


@dataclass(frozen=True)
class Holds:
    """What keeps a storage or namespace from being retired: its enabled plans
    (``namespace/kind``) and its active jobs (``namespace/job-id STATE``), at most ``SHOWN`` of
    each, with their full counts."""

    plans: tuple[str, ...]
    plan_count: int
    jobs: tuple[str, ...]
    job_count: int

    SHOWN = 5

    def __bool__(self) -> bool:
        return bool(self.plan_count or self.job_count)

    def describe(self) -> str:
        """``2 enabled plans (acme/tasks, acme/events) and 1 active job (acme/0f.. FAILED)``."""
        parts = []
        for count, shown, what in (
            (self.plan_count, self.plans, "enabled plan"),
            (self.job_count, self.jobs, "active job"),
        ):
            if count:
                more = f", {count - len(shown)} more" if count > len(shown) else ""
                plural = "s" if count != 1 else ""
                parts.append(f"{count} {what}{plural} ({', '.join(shown)}{more})")
        return " and ".join(parts)


def _retirement(row: Any) -> Retirement:
    return Retirement(
        RetiredKind(row.target_kind), bytes(row.target_id), row.reason, row.retired_by,
        row.retired_at,
    )  # fmt: skip


def retirement(
    conn: Connection, kind: RetiredKind, target_id: bytes, *, shared: bool = False
) -> Retirement | None:
    """The retirement of a storage or namespace, or None. ``shared``: read with a shared lock
    (a locking read on the primary key), so that a retirement committing between this check and
    the write it guards waits for that write's transaction instead (``plan set``)."""
    r = retirements.c
    query = select(retirements).where(r.target_kind == kind.value, r.target_id == target_id)
    if shared:
        query = query.with_for_update(read=True)
    row = conn.execute(query).first()
    return None if row is None else _retirement(row)


def retirements_of(conn: Connection, kind: RetiredKind) -> dict[bytes, Retirement]:
    """Every retired storage (or namespace): a small registry, read whole."""
    rows = conn.execute(select(retirements).where(retirements.c.target_kind == kind.value))
    return {bytes(r.target_id): _retirement(r) for r in rows}


def retired_ids_query(kind: RetiredKind) -> Any:
    """The ids of the retired storages (or namespaces), as a subquery for ``NOT IN``."""
    r = retirements.c
    return select(r.target_id).where(r.target_kind == kind.value)


def holds_queries(
    *,
    storage_id: bytes | None = None,
    namespace_id: bytes | None = None,
    active_states: Collection[str],
) -> tuple[Any, Any]:
    """The locking reads of :func:`holds`: the enabled plans (on ``ix_archive_plan_due`` for a
    storage, the primary key for a namespace) and the jobs in ``active_states``
    (``ix_archive_job_claim`` for a storage, the primary key's namespace prefix for a
    namespace)."""
    p, j = archive_plans.c, archive_jobs.c
    if storage_id is not None:
        plan_cond, job_cond = p.storage_id == storage_id, j.storage_id == storage_id
    else:
        plan_cond, job_cond = p.namespace_id == namespace_id, j.namespace_id == namespace_id
    plans = (
        select(p.namespace_id, p.kind)
        .where(plan_cond, p.enabled == true())
        .order_by(p.namespace_id, p.kind)
        .with_for_update()
    )
    jobs = (
        select(j.namespace_id, j.id, j.state)
        .where(job_cond, j.state.in_(sorted(active_states)))
        .order_by(j.namespace_id, j.id)
        .with_for_update()
    )
    return plans, jobs


def holds(
    conn: Connection,
    *,
    storage_id: bytes | None = None,
    namespace_id: bytes | None = None,
    active_states: Collection[str],
) -> Holds:
    """The enabled plans and the jobs in ``active_states`` of a storage or a namespace, read
    with an exclusive lock (``FOR UPDATE``): a plan enabled or a job changed by a transaction
    that has not committed yet is waited for, and read as it committed."""
    plan_query, job_query = holds_queries(
        storage_id=storage_id, namespace_id=namespace_id, active_states=active_states
    )
    plan_rows = conn.execute(plan_query).all()
    job_rows = conn.execute(job_query).all()
    names = _namespace_names(conn, {bytes(r.namespace_id) for r in [*plan_rows, *job_rows]})

    def ns(ns_id: Any) -> str:
        return names.get(bytes(ns_id), bytes(ns_id).hex())

    return Holds(
        plans=tuple(f"{ns(r.namespace_id)}/{r.kind}" for r in plan_rows[: Holds.SHOWN]),
        plan_count=len(plan_rows),
        jobs=tuple(
            f"{ns(r.namespace_id)}/{bytes(r.id).hex()} {r.state}" for r in job_rows[: Holds.SHOWN]
        ),
        job_count=len(job_rows),
    )


def _namespace_names(conn: Connection, ns_ids: Collection[bytes]) -> dict[bytes, str]:
    if not ns_ids:
        return {}
    rows = conn.execute(
        select(namespaces.c.id, namespaces.c.name).where(namespaces.c.id.in_(ns_ids))
    )
    return {bytes(r.id): str(r.name) for r in rows}


def insert_retirement(
    conn: Connection, kind: RetiredKind, target_id: bytes, *, reason: str, actor: str,
    at: datetime,
) -> Retirement | None:  # fmt: skip
    """Record the retirement, or return the one already recorded (nothing is written then).
    Inserted first, before the caller checks what holds the target: a concurrent ``plan set``
    that read the retirement with a shared lock either committed before (and is seen) or waits
    for this transaction (and sees the row)."""
    existing = retirement(conn, kind, target_id)
    if existing is not None:
        return existing
    try:
        conn.execute(
            insert(retirements).values(
                target_kind=kind.value,
                target_id=target_id,
                reason=reason,
                retired_by=actor[:128],
                retired_at=at,
            )
        )
    except IntegrityError:
        raise ConflictError(f"{kind.value} {target_id.hex()} was retired concurrently") from None
    return None
