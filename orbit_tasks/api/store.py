"""Every SQL statement of the reference platform API.

Acceptance is one transaction: the idempotency record (unique per namespace and key) first, then
the task and the audit row. A concurrent request with the same key blocks on that unique key and,
once the winner commits, fails with a duplicate-key error; it then reads the committed record and
replays it (or answers 409). The platform clock is ``db_now``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, insert, select
from sqlalchemy.exc import IntegrityError, OperationalError

from orbit_tasks.api import receipts
from orbit_tasks.api.receipts import ApiProblem
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.faults import driver_code, is_lock_conflict
from orbit_tasks.db.history_tables import idempotency_records, tasks
from orbit_tasks.db.platform_tables import namespaces, queues
from orbit_tasks.ids import from_hex, is_hex_id, new_id
from orbit_tasks.logs import log_action
from orbit_tasks.platform.store import Credential, insert_audit, lookup_credential

log = logging.getLogger("orbit.api.store")

# MySQL/MariaDB: deadlock, lock wait timeout. Retried a few times, then 503.
_ATTEMPTS = 5


@dataclass(frozen=True)
class Identity:
    credential: Credential
    namespace_name: str
    namespace_state: str


@dataclass(frozen=True)
class Outcome:
    status: int  # 201 accepted, 200 replayed
    receipt: str
    task_id: str


def authenticate(conn: Connection, token: str) -> Identity:
    cred = lookup_credential(conn, token)
    if cred is None:
        raise receipts.unauthenticated()
    row = conn.execute(
        select(namespaces.c.name, namespaces.c.state).where(namespaces.c.id == cred.namespace_id)
    ).first()
    if row is None:
        raise receipts.unauthenticated()
    return Identity(cred, row.name, row.state)


def identity_document(conn: Connection, ident: Identity) -> dict[str, object]:
    """The body of ``GET /v1/credential``."""
    cred = ident.credential
    stmt = select(queues.c.id, queues.c.name).where(queues.c.namespace_id == cred.namespace_id)
    if cred.queue_ids is not None:
        stmt = stmt.where(queues.c.id.in_(list(cred.queue_ids) or [b""]))
    rows = conn.execute(stmt.order_by(queues.c.name)).all()
    return {
        "credential_id": cred.id.hex(),
        "namespace_id": cred.namespace_id.hex(),
        "namespace": ident.namespace_name,
        "all_queues": cred.queue_ids is None,
        "queues": [{"id": r.id.hex(), "name": r.name} for r in rows],
    }


def _forbidden(message: str) -> ApiProblem:
    return ApiProblem(403, "forbidden", message)


def authorize_queue(conn: Connection, ident: Identity, ns_ref: str, queue_ref: str) -> bytes:
    """The queue id the request may submit to: 403 for another namespace or a queue outside the
    allow-list, 404 for an unknown queue of the credential's own namespace."""
    cred = ident.credential
    own = ns_ref.lower() == cred.namespace_id.hex() if is_hex_id(ns_ref) else False
    if not own and ns_ref != ident.namespace_name:
        raise _forbidden("the credential is not bound to this namespace")
    if ident.namespace_state != "ACTIVE":
        raise _forbidden("the namespace is disabled")
    cond = queues.c.name == queue_ref
    if is_hex_id(queue_ref):
        cond = (queues.c.id == from_hex(queue_ref)) | cond
    row = conn.execute(
        select(queues.c.id).where(queues.c.namespace_id == cred.namespace_id, cond).limit(1)
    ).first()
    if row is None:
        raise ApiProblem(404, "queue_not_found", "no such queue in this namespace")
    queue_id: bytes = row.id
    if cred.queue_ids is not None and queue_id not in cred.queue_ids:
        raise _forbidden("the queue is not in the credential's allow-list")
    return queue_id


def _replay(conn: Connection, ns_id: bytes, key: str, queue_id: bytes, sha: str) -> Outcome | None:
    row = conn.execute(
        select(
            idempotency_records.c.idempotency_key,
            idempotency_records.c.request_sha256,
            idempotency_records.c.task_id,
            idempotency_records.c.receipt_json,
        ).where(
            idempotency_records.c.namespace_id == ns_id,
            idempotency_records.c.idempotency_key == key,
        )
    ).first()
    if row is None:
        return None
    same = row.idempotency_key == key and receipts.replay_decision(
        stored_sha256=row.request_sha256,
        stored_queue_hex=receipts.receipt_queue_id(row.receipt_json),
        request_sha=sha,
        queue_hex=queue_id.hex(),
    )
    if not same:
        log_action(log, "api.task.conflict", namespace_id=ns_id, queue_id=queue_id)
        raise receipts.conflict()
    log_action(log, "api.task.replayed", namespace_id=ns_id, task_id=row.task_id)
    return Outcome(200, row.receipt_json, row.task_id.hex())


def _accept(
    conn: Connection,
    ident: Identity,
    queue_id: bytes,
    key: str,
    text: str,
    sha: str,
    size: int,
) -> Outcome:
    ns_id = ident.credential.namespace_id
    now: datetime = db_now(conn)
    task_id = new_id()
    record_id = new_id()
    receipt = receipts.build_receipt(
        task_id=task_id,
        namespace_id=ns_id,
        queue_id=queue_id,
        idempotency_key=key,
        accepted_at=now,
    )
    # The contended unique key first, so that racing requests wait here, not after other writes.
    conn.execute(
        insert(idempotency_records).values(
            namespace_id=ns_id,
            id=record_id,
            idempotency_key=key,
            request_sha256=sha,
            task_id=task_id,
            receipt_json=receipt,
            created_at=now,
            expires_at=receipts.expires_at(now),
        )
    )
    conn.execute(
        insert(tasks).values(
            namespace_id=ns_id,
            id=task_id,
            queue_id=queue_id,
            state="QUEUED",
            idempotency_key=key,
            request_json=text,
            created_at=now,
        )
    )
    insert_audit(
        conn,
        ns_id,
        actor=f"credential:{ident.credential.id.hex()}",
        action="api.task.accepted",
        target_kind="task",
        target_id=task_id.hex(),
        detail={
            "queue_id": queue_id.hex(),
            "idempotency_record_id": record_id.hex(),
            "request_bytes": size,
        },
        at=now,
    )
    return Outcome(201, receipt, task_id.hex())


def submit_task(
    engine: Engine, token: str, ns_ref: str, queue_ref: str, key_header: str | None, raw: bytes
) -> Outcome:
    """``POST /v1/namespaces/{ns}/queues/{queue}/tasks`` after the body was read (≤ 1 MiB)."""
    with engine.connect() as conn:
        ident = authenticate(conn, token)
        key = receipts.validate_idempotency_key(key_header)
        text = receipts.validate_body(raw)
        queue_id = authorize_queue(conn, ident, ns_ref, queue_ref)
        conn.rollback()
    ns_id = ident.credential.namespace_id
    sha = receipts.request_sha256(raw)
    for attempt in range(1, _ATTEMPTS + 1):
        with engine.connect() as conn:
            found = _replay(conn, ns_id, key, queue_id, sha)
            conn.rollback()
            if found is not None:
                return found
            try:
                with conn.begin():
                    outcome = _accept(conn, ident, queue_id, key, text, sha, len(raw))
            except IntegrityError:
                log_action(log, "api.task.raced", namespace_id=ns_id, attempt=attempt)
                continue  # another request with this key committed first: read it back
            except OperationalError as exc:
                if not is_lock_conflict(exc):
                    raise
                log_action(log, "api.task.retry", namespace_id=ns_id, code=driver_code(exc))
                continue
        log_action(
            log,
            "api.task.accepted",
            namespace_id=ns_id,
            queue_id=queue_id,
            task_id=outcome.task_id,
            request_bytes=len(raw),
        )
        return outcome
    raise receipts.unavailable("the platform database is busy; retry later")


def credential_identity(engine: Engine, token: str) -> dict[str, object]:
    """``GET /v1/credential``."""
    with engine.connect() as conn:
        doc = identity_document(conn, authenticate(conn, token))
        conn.rollback()
    return doc


def check_ready(engine: Engine) -> None:
    """Readiness (``/readyz``): a connection and one read of the namespaces table."""
    with engine.connect() as conn:
        conn.execute(select(namespaces.c.id).limit(1)).first()
        conn.rollback()
