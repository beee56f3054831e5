"""``enqueue()``: write a frozen submission request into the application's own transaction.

The caller's business row and the outbox row commit (or roll back) together; this function never
commits. Validation happens before anything is written, and every error names the value and the
limit (SPEC §8).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

from orbit_tasks import json_document
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.faults import DEADLOCK, driver_code, is_lock_conflict
from orbit_tasks.errors import ConflictError, InvalidInput, TransientError
from orbit_tasks.sender import policy
from orbit_tasks.sender.store import entries, pruning
from orbit_tasks.sender.wakeup import wake_after_commit

MAX_REQUEST_BYTES = json_document.MAX_DOCUMENT_BYTES  # the platform's limit (413 above it)
MAX_SOURCE_REF_CHARS = 512
MAX_DEPTH = json_document.MAX_DEPTH
CREDENTIAL_KEYS = frozenset({"authorization", "password", "secret", "token", "api_key"})
# URL userinfo (``scheme://user:pw@`` or scheme-relative ``//user:pw@``), and URL parameters that
# carry a credential (``?token=...``, ``#access_token=...``).
_USERINFO = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.\-]*:)?//[^/?#\s]*@")
_URL_PARAM = re.compile(r"[?&#;]([^=&#;?\s]+)=")
CREDENTIAL_PARAMS = CREDENTIAL_KEYS | {"access_token", "refresh_token", "client_secret", "apikey"}


class InvalidRequest(InvalidInput):
    """The request, ids or source reference cannot be enqueued; nothing was written."""


class OutboxConflict(ConflictError):
    """The (namespace, operation) already holds a different request (or queue/source_ref)."""


class OutboxRetry(TransientError):
    """The database ended ``enqueue()``'s statement in a lock conflict: a deadlock (1213; the
    server rolled the caller's whole transaction back) or a lock wait timeout (1205). Nothing
    of this transaction may be trusted: roll it back and run it again (docs/sender.md "What an
    application retries"). ``code`` is the driver's error number; the driver's error is the
    ``__cause__``."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code

    @classmethod
    def of(cls, ns: str, op: str, exc: OperationalError) -> OutboxRetry:
        code = int(driver_code(exc))
        what = "deadlock" if code == DEADLOCK else "lock wait timeout"
        return cls(
            f"enqueue of operation {op} in namespace {ns} met a {what} (driver code {code}); "
            "roll the transaction back and run it again",
            code=code,
        )


@dataclass(frozen=True)
class OutboxEntry:
    namespace_id: str
    queue_id: str
    operation_id: str
    idempotency_key: str
    state: str
    created_at: dt.datetime
    send_deadline_at: dt.datetime
    created: bool  # False: the same request was already enqueued (returned as it is)


# --- validation ---------------------------------------------------------------------------------


def _check_hex(value: object, what: str) -> str:
    if not policy.is_hex32(value):
        raise InvalidRequest(
            f"{what} {value!r} must be 32 lowercase hexadecimal characters [0-9a-f]{{32}}"
        )
    assert isinstance(value, str)
    return value


def _checked(text: str) -> Any:
    """The one body rule shared with the platform API (orbit_tasks/json_document.py)."""
    try:
        return json_document.check_document(text, subject="request")[1]
    except json_document.DocumentProblem as exc:
        if exc.code == "duplicate_key":
            # A local error for the application's developer: naming the key is fine here.
            raise InvalidRequest(f"request has the key {exc.key!r} twice in one object") from None
        raise InvalidRequest(exc.message) from None


def _encode(value: Any, path: str) -> str:
    """Exact JSON text: Decimal and int digits as written, never through float."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        raise InvalidRequest(
            f"request value at {path} is a float ({value!r}); floats are not exact - "
            "pass decimal.Decimal (or the request as JSON text)"
        )
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidRequest(f"request value at {path} is {value}; JSON numbers are finite")
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        parts = []
        for key in value:
            if not isinstance(key, str):
                raise InvalidRequest(f"request key {key!r} at {path} is not a string")
        for key in sorted(value):
            parts.append(
                json.dumps(key, ensure_ascii=False) + ":" + _encode(value[key], f"{path}.{key}")
            )
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_encode(v, f"{path}[{i}]") for i, v in enumerate(value)) + "]"
    raise InvalidRequest(
        f"request value at {path} has type {type(value).__name__}; allowed: dict, list, str, "
        "int, Decimal, bool, None"
    )


def freeze_request(request: str | dict[str, Any]) -> str:
    """The exact text to store: the caller's text as given, or a canonical exact serialization
    (sorted keys, no spaces). Refuses non-objects, > 1 MiB and credential-like top-level keys."""
    if isinstance(request, str):
        text = request
    elif isinstance(request, dict):
        try:
            text = _encode(request, "$")
        except RecursionError:
            raise InvalidRequest(json_document.too_deep_message("request")) from None
    else:
        raise InvalidRequest(
            f"request has type {type(request).__name__}; pass a dict or the JSON object as str"
        )
    doc = _checked(text)
    for key in doc:
        if key.lower().replace("-", "_") in CREDENTIAL_KEYS:
            raise InvalidRequest(
                f"request has the credential-like top-level key {key!r}; keys "
                f"{sorted(CREDENTIAL_KEYS)} are refused (the sender authenticates itself)"
            )
    return text


def check_source_ref(source_ref: object) -> str:
    if not isinstance(source_ref, str):
        raise InvalidRequest(f"source_ref has type {type(source_ref).__name__}; a str is required")
    if not 1 <= len(source_ref) <= MAX_SOURCE_REF_CHARS:
        raise InvalidRequest(
            f"source_ref is {len(source_ref)} characters; allowed 1..{MAX_SOURCE_REF_CHARS}"
        )
    try:
        source_ref.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest("source_ref contains a lone surrogate; not valid UTF-8") from None
    if _USERINFO.search(source_ref):
        raise InvalidRequest(
            "source_ref embeds credentials (a 'scheme://user[:password]@' part); store a "
            "reference without userinfo"
        )
    for name in _URL_PARAM.findall(source_ref):
        if name.lower().replace("-", "_") in CREDENTIAL_PARAMS:
            raise InvalidRequest(
                f"source_ref embeds credentials (URL parameter {name!r}; refused: "
                f"{sorted(CREDENTIAL_PARAMS)}); store a reference without them"
            )
    if any(ord(ch) < 32 for ch in source_ref):
        raise InvalidRequest("source_ref contains control characters; allowed: printable text")
    return source_ref


# --- enqueue ------------------------------------------------------------------------------------


def _connection(conn: Connection | Session) -> Connection:
    if isinstance(conn, Connection):
        return conn
    # A Session exists only once its caller imported the ORM; the CLI and the workers never do
    # (importing it cost every `orbit sender` command 0.17 s, measured with -X importtime).
    orm = sys.modules.get("sqlalchemy.orm")
    if orm is not None and isinstance(conn, orm.Session):
        session: Session = conn
        return session.connection()
    raise InvalidRequest(
        f"conn has type {type(conn).__name__}; pass a SQLAlchemy Connection or Session"
    )


def _entry(row: Any, created: bool) -> OutboxEntry:
    return OutboxEntry(
        namespace_id=row.namespace_id,
        queue_id=row.queue_id,
        operation_id=row.operation_id,
        idempotency_key=row.idempotency_key,
        state=row.state,
        created_at=row.created_at,
        send_deadline_at=row.send_deadline_at,
        created=created,
    )


def _existing(
    conn: Connection,
    ns: str,
    queue: str,
    op: str,
    digest: bytes,
    source_ref: str,
    latest: bool = False,
) -> OutboxEntry | None:
    """What is there for (ns, op), compared with this request. ``latest``: locking reads (after
    a duplicate key, the row another transaction committed after this one's snapshot)."""
    row = entries.get_row(conn, ns, op, latest)
    if row is None:
        # Read after the outbox row: a prune commits the compact record and the deletion
        # together, so one of the two reads sees the operation (docs/sender.md "Retention").
        return _existing_pruned(conn, ns, queue, op, digest, source_ref, latest)
    if bytes(row.request_digest) != digest:
        raise OutboxConflict(
            f"operation {op} in namespace {ns} is already enqueued with another request "
            "(digest differs); never reuse an operation id for a different request"
        )
    if row.queue_id != queue:
        raise OutboxConflict(
            f"operation {op} in namespace {ns} is already enqueued for queue {row.queue_id}, "
            f"not {queue}"
        )
    job = entries.get_job(conn, ns, op, latest)
    if job is not None and job.source_ref != source_ref:
        raise OutboxConflict(
            f"operation {op} in namespace {ns} is already enqueued with another source_ref "
            "(fixed at first insert)"
        )
    return _entry(row, created=False)


def _no_pruned_table(exc: Exception) -> bool:
    """The database has no ``sender_pruned`` (MySQL 1146, SQLite "no such table"): the
    statement failed alone, the caller's transaction goes on (MySQL, SQLite)."""
    text = str(getattr(exc, "orig", exc))
    return "sender_pruned" in text and (driver_code(exc) == 1146 or "no such table" in text)


def _existing_pruned(
    conn: Connection,
    ns: str,
    queue: str,
    op: str,
    digest: bytes,
    source_ref: str,
    latest: bool = False,
    inserted: bool = False,
) -> OutboxEntry | None:
    """A pruned operation answers exactly as its outbox row did: the same request (and queue,
    source_ref) is the existing entry, nothing is sent again; another is a conflict.
    ``inserted``: the ``sender_jobs`` row there is this call's own (there was none before)."""
    try:
        pruned = pruning.get_pruned(conn, ns, op, latest)
    except (OperationalError, ProgrammingError) as exc:
        if not _no_pruned_table(exc):
            raise
        return None  # only the seed tables (revision b0001): nothing was ever pruned
    if pruned is None:
        return None
    if bytes(pruned.request_digest) != digest:
        raise OutboxConflict(
            f"operation {op} in namespace {ns} was already enqueued with another request "
            "(digest differs; its outbox row was pruned); never reuse an operation id for a "
            "different request"
        )
    if pruned.queue_id != queue:
        raise OutboxConflict(
            f"operation {op} in namespace {ns} was already enqueued for queue "
            f"{pruned.queue_id}, not {queue}"
        )
    job = None if inserted else entries.get_job(conn, ns, op, latest)
    ref_differs = (
        job.source_ref != source_ref
        if job is not None
        else pruned.source_ref_digest is not None
        and bytes(pruned.source_ref_digest) != policy.digest(source_ref)
    )
    if ref_differs:
        raise OutboxConflict(
            f"operation {op} in namespace {ns} was already enqueued with another source_ref "
            "(fixed at first insert)"
        )
    return OutboxEntry(
        namespace_id=ns,
        queue_id=pruned.queue_id,
        operation_id=op,
        idempotency_key=policy.idempotency_key(op),
        state=pruned.state,
        created_at=pruned.created_at,
        send_deadline_at=pruned.send_deadline_at,
        created=False,
    )


class _Pruned(Exception):
    """The operation turned out to be pruned after the insert: roll the savepoint back."""

    def __init__(self, entry: OutboxEntry) -> None:
        super().__init__()
        self.entry = entry


def _deadlock_in(exc: BaseException) -> OperationalError | None:
    """The driver's deadlock or lock wait timeout (1213, 1205) behind ``exc``: itself, or the
    error a failed ``ROLLBACK TO SAVEPOINT`` hid (a deadlock rolls the whole transaction back,
    so the savepoint is gone: 1305 ``SAVEPOINT ... does not exist``, the 1213 in its context)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OperationalError) and is_lock_conflict(current):
            return current
        todo += [current.__cause__, current.__context__]
    return None


def enqueue(
    conn: Connection | Session,
    *,
    namespace_id: str,
    queue_id: str,
    operation_id: str,
    request: str | dict[str, Any],
    source_ref: str,
) -> OutboxEntry:
    """Insert the ``sender_jobs`` row and the frozen ``sender_outbox`` row in the caller's
    transaction (never commits). Enqueueing the same (namespace, operation) with the same request
    again returns the existing entry; a different request raises :class:`OutboxConflict`.

    "This operation is new" is decided by reads that see committed rows, whatever the caller's
    isolation level and however old its snapshot: the primary keys (the insert) and a locking
    read of ``sender_pruned`` after it (docs/sender.md "The snapshot rule"). A deadlock or lock
    wait timeout is :class:`OutboxRetry`: roll the transaction back and run it again."""
    ns = _check_hex(namespace_id, "namespace_id")
    queue = _check_hex(queue_id, "queue_id")
    op = _check_hex(operation_id, "operation_id")
    text = freeze_request(request)
    ref = check_source_ref(source_ref)
    digest = policy.digest(text)
    c = _connection(conn)
    try:
        return _enqueue(c, ns, queue, op, text, digest, ref)
    except (OperationalError, ProgrammingError) as exc:
        conflict = _deadlock_in(exc)
        if conflict is None:
            raise
        raise OutboxRetry.of(ns, op, conflict) from conflict


def _enqueue(
    c: Connection, ns: str, queue: str, op: str, text: str, digest: bytes, ref: str
) -> OutboxEntry:
    now = db_now(c)
    try:
        # Insert first: the primary keys of sender_jobs and sender_outbox see every committed
        # row (a plain read would answer from the caller's snapshot), and two inserts into one
        # index gap never deadlock, where two SERIALIZABLE reads of the gap before them did.
        with c.begin_nested():
            entries.insert_entry(
                c,
                namespace_id=ns,
                queue_id=queue,
                operation_id=op,
                request_json=text,
                request_digest=digest,
                source_ref=ref,
                now=now,
            )
            # A prune deletes the outbox row and inserts its record in one transaction, and
            # the insert above waited for that delete: the record is committed by now, and a
            # locking read sees it (the insert is rolled back; the record answers).
            pruned = _existing_pruned(c, ns, queue, op, digest, ref, True, inserted=True)
            if pruned is not None:
                raise _Pruned(pruned)
    except _Pruned as found:
        return found.entry
    except IntegrityError:
        # The operation is there (committed by now, or by another transaction this one waited
        # for), or a sender_jobs row without its outbox row: compare with what is there now
        # (locking reads), not with the caller's snapshot.
        existing = _existing(c, ns, queue, op, digest, ref, latest=True)
        if existing is not None:
            return existing
        raise OutboxConflict(
            f"operation {op} in namespace {ns} already has a sender_jobs row without an outbox "
            "row; refusing to enqueue over it"
        ) from None
    row = entries.get_row(c, ns, op)
    wake_after_commit(c)  # one sender wake-up once the caller's transaction commits
    return _entry(row, created=True)
