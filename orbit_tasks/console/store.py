"""Every SQL statement of the console that the CLI has none for (issue 29): its people and
sessions, the jobs list across the filters of the page, the audit log page. Every number the
CLI shows comes from the CLI's own stores instead (docs/console.md "Where the numbers come
from")."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, insert, or_, select

from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.console.access import Role
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_jobs, console_sessions, console_users
from orbit_tasks.errors import ConflictError, InvalidInput, NotFound

U, S, J, A = console_users.c, console_sessions.c, archive_jobs.c, audit_events.c


@dataclass(frozen=True)
class User:
    name: str
    role: Role
    secret_hash: str
    created_by: str
    created_at: datetime


def _user(row: Any) -> User:
    return User(row.name, Role(row.role), row.secret_hash, row.created_by, row.created_at)


# --- people -------------------------------------------------------------------------------------


def add_user(conn: Connection, name: str, role: Role, secret_hash: str, created_by: str) -> None:
    if get_user(conn, name) is not None:
        raise ConflictError(f"console user {name!r} exists already (remove it first)")
    conn.execute(
        insert(console_users).values(
            name=name, role=role.value, secret_hash=secret_hash, created_by=created_by[:128]
        )
    )


def get_user(conn: Connection, name: str) -> User | None:
    row = conn.execute(select(console_users).where(U.name == name)).first()
    return None if row is None else _user(row)


def list_users(conn: Connection) -> list[User]:
    return [_user(r) for r in conn.execute(select(console_users).order_by(U.name))]


def remove_user(conn: Connection, name: str) -> None:
    """The user and every session of theirs (signed out at once)."""
    if conn.execute(delete(console_users).where(U.name == name)).rowcount == 0:
        raise NotFound(f"console user {name!r} does not exist (see orbit console user list)")
    conn.execute(delete(console_sessions).where(S.user_name == name))


# --- sessions -----------------------------------------------------------------------------------


def open_session(conn: Connection, digest: str, user: str, now: datetime, seconds: int) -> None:
    conn.execute(
        insert(console_sessions).values(
            session_sha256=digest,
            user_name=user,
            created_at=now,
            expires_at=now + timedelta(seconds=seconds),
        )
    )


def session_user(conn: Connection, digest: str, now: datetime) -> User | None:
    """The person of a live session (a removed user's session is gone with them)."""
    row = conn.execute(
        select(console_users)
        .join(console_sessions, S.user_name == U.name)
        .where(S.session_sha256 == digest, S.expires_at > now)
    ).first()
    return None if row is None else _user(row)


def close_session(conn: Connection, digest: str) -> None:
    conn.execute(delete(console_sessions).where(S.session_sha256 == digest))


# --- cursors ------------------------------------------------------------------------------------


def encode_key(at: datetime, row_id: bytes) -> str:
    raw = json.dumps([at.isoformat(), row_id.hex()]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_key(cursor: str) -> tuple[datetime, bytes]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, hex_id = json.loads(raw)
        return datetime.fromisoformat(at), bytes.fromhex(hex_id)
    except (ValueError, TypeError):
        raise InvalidInput(f"after {cursor!r} is not a cursor of this page") from None


# --- jobs of a namespace, by kind and storage (the CLI filters by state only) -------------------


def list_jobs(
    conn: Connection,
    ns_id: bytes,
    *,
    state: JobState | None,
    kind: str | None,
    storage_id: bytes | None,
    limit: int,
    after: str | None,
) -> tuple[list[Job], str | None]:
    """Jobs of a namespace oldest first, keyset on ``ix_archive_job_list`` (namespace_id,
    created_at, id); kind, state and storage filter the index range."""
    q = select(archive_jobs).where(J.namespace_id == ns_id)
    if state is not None:
        q = q.where(J.state == state.value)
    if kind is not None:
        q = q.where(J.kind == kind)
    if storage_id is not None:
        q = q.where(J.storage_id == storage_id)
    if after is not None:
        at, job_id = decode_key(after)
        q = q.where(or_(J.created_at > at, and_(J.created_at == at, J.id > job_id)))
    rows = conn.execute(q.order_by(J.created_at, J.id).limit(limit + 1)).all()
    jobs = [Job.from_row(r) for r in rows[:limit]]
    nxt = encode_key(jobs[-1].created_at, jobs[-1].id) if len(rows) > limit else None
    return jobs, nxt


def stalled_jobs(conn: Connection, storages: list[bytes], now: datetime, limit: int) -> list[Job]:
    """RUNNING jobs whose lease has expired (a dead or frozen worker): the next sweep hands
    them to another worker; many of them need a person (docs/operations.md). An index range
    of ``ix_archive_job_claim`` (storage_id, state, lease_until) per storage."""
    if not storages:
        return []
    q = (
        select(archive_jobs)
        .where(J.storage_id.in_(storages), J.state == JobState.RUNNING.value, J.lease_until < now)
        .order_by(J.lease_until)
        .limit(limit)
    )
    return [Job.from_row(r) for r in conn.execute(q)]


def failed_jobs(conn: Connection, storages: list[bytes], limit: int) -> list[Job]:
    """FAILED jobs, oldest change first (each needs `job retry` or `job abandon`): the index
    range (storage_id, state) of ``ix_archive_job_claim``."""
    if not storages:
        return []
    q = (
        select(archive_jobs)
        .where(J.storage_id.in_(storages), J.state == JobState.FAILED.value)
        .order_by(J.updated_at)
        .limit(limit)
    )
    return [Job.from_row(r) for r in conn.execute(q)]


# --- the audit log ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditRow:
    namespace_id: bytes
    id: bytes
    actor: str
    action: str
    target_kind: str
    target_id: str
    detail: dict[str, Any]
    created_at: datetime


def audit_page(
    conn: Connection,
    *,
    namespace_id: bytes | None = None,
    actor: str | None = None,
    action: str | None = None,
    target_id: str | None = None,
    limit: int = 50,
    after: str | None = None,
) -> tuple[list[AuditRow], str | None]:
    """Audit rows newest first, keyset on (created_at, id) descending; with a namespace on
    ``ix_audit_settled``."""
    q = select(audit_events)
    if namespace_id is not None:
        q = q.where(A.namespace_id == namespace_id)
    if actor:
        q = q.where(A.actor == actor)
    if action:
        q = q.where(A.action == action)
    if target_id:
        q = q.where(A.target_id == target_id)
    if after is not None:
        at, row_id = decode_key(after)
        q = q.where(or_(A.created_at < at, and_(A.created_at == at, A.id < row_id)))
    rows = conn.execute(q.order_by(A.created_at.desc(), A.id.desc()).limit(limit + 1)).all()
    page = [
        AuditRow(
            bytes(r.namespace_id),
            bytes(r.id),
            r.actor,
            r.action,
            r.target_kind,
            r.target_id,
            json.loads(r.detail_json),
            r.created_at,
        )  # fmt: skip
        for r in rows[:limit]
    ]
    nxt = encode_key(page[-1].created_at, page[-1].id) if len(rows) > limit else None
    return page, nxt
