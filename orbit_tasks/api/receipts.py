"""Pure rules of the reference platform API: request validation and acceptance receipts.

No I/O here. The raw request bytes are what the platform stores (decoded as UTF-8, never
re-serialized); parsing only *checks* them, with the one body rule that ``enqueue()`` applies too
(``orbit_tasks/json_document.py``), so a value such as ``12345678901234567890.123456789`` or
``1e400`` is never squeezed through a float.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta
from typing import Any

from orbit_tasks import json_document
from orbit_tasks.timestamps import format_ts

MAX_BODY_BYTES = json_document.MAX_DOCUMENT_BYTES  # 1 MiB
MAX_KEY_LENGTH = 128
IDEMPOTENCY_RETENTION = timedelta(hours=72)
RECEIPT_FIELDS = ("accepted_at", "idempotency_key", "namespace_id", "queue_id", "task_id")

# Printable ASCII (0x20..0x7E); no space at either end (HTTP strips it, and MariaDB's PAD SPACE
# collations would treat "k" and "k " as the same key).
_KEY = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


# A 503 tells the client when to come back (the sender honours it as the floor of its backoff).
RETRY_AFTER_SECONDS = 1
_MEDIA_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]{1,64}/[A-Za-z0-9!#$&^_.+-]{1,64}$")


class ApiProblem(Exception):
    """An HTTP error answer: status, stable code and a short message (never the body/token)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        if status == 401:
            self.headers.setdefault("WWW-Authenticate", "Bearer")
        if status == 503:
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_SECONDS))

    def body(self) -> bytes:
        return canonical_json({"error": self.code, "message": self.message}).encode("utf-8")


def unavailable(message: str = "database unavailable; retry later") -> ApiProblem:
    return ApiProblem(503, "unavailable", message)


def unauthenticated() -> ApiProblem:
    return ApiProblem(401, "unauthenticated", "missing, unknown or revoked bearer token")


def too_large(size: int | None = None) -> ApiProblem:
    what = "over the limit" if size is None else f"{size} bytes"
    return ApiProblem(413, "too_large", f"request body is {what} (allowed 0..{MAX_BODY_BYTES})")


def canonical_json(value: dict[str, Any]) -> str:
    """Sorted keys, no spaces, non-ASCII kept as UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- headers -------------------------------------------------------------------------------------


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, else 401."""
    if not authorization:
        raise unauthenticated()
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 512:
        raise unauthenticated()
    return token


def validate_idempotency_key(key: str | None) -> str:
    """1..128 printable ASCII characters, no space at either end; else 400."""
    if key is None or key == "":
        raise ApiProblem(
            400,
            "bad_idempotency_key",
            f"Idempotency-Key header is required (1..{MAX_KEY_LENGTH} printable ASCII characters)",
        )
    if len(key) > MAX_KEY_LENGTH:
        raise ApiProblem(
            400,
            "bad_idempotency_key",
            f"Idempotency-Key is {len(key)} characters long (allowed 1..{MAX_KEY_LENGTH})",
        )
    if not _KEY.match(key):
        raise ApiProblem(
            400,
            "bad_idempotency_key",
            "Idempotency-Key has a character outside printable ASCII 0x20..0x7E "
            "or a space at either end",
        )
    return key


def check_content_type(value: str | None) -> None:
    """A body must be declared ``application/json`` (charset, if given, ``utf-8``); else 415."""
    media, _, params = (value or "").partition(";")
    media = media.strip()
    allowed = "allowed: application/json with UTF-8"
    if media.lower() != "application/json":
        shown = repr(media) if _MEDIA_TYPE.match(media) else "missing or unreadable"
        raise ApiProblem(
            415, "unsupported_media_type", f"Content-Type {shown} is not supported ({allowed})"
        )
    for param in params.split(";"):
        name, _, raw = param.partition("=")
        if name.strip().lower() != "charset":
            continue
        charset = raw.strip().strip('"').lower()
        if charset not in ("utf-8", "utf8"):
            shown = repr(charset) if _MEDIA_TYPE.match(f"x/{charset}") else "unreadable"
            raise ApiProblem(
                415, "unsupported_media_type", f"charset {shown} is not supported ({allowed})"
            )


def content_length(value: str | None) -> int | None:
    """The declared ``Content-Length`` (413 early when it is over the limit)."""
    if value is None:
        return None
    try:
        size = int(value.strip())
    except ValueError:
        raise ApiProblem(400, "bad_request", "Content-Length is not an integer") from None
    if size < 0:
        raise ApiProblem(400, "bad_request", "Content-Length is negative")
    if size > MAX_BODY_BYTES:
        raise too_large(size)
    return size


# --- body ----------------------------------------------------------------------------------------

# The parser of the one body rule (orbit_tasks/json_document.py), shared with enqueue().
parse_exact = json_document.parse_exact


def validate_body(raw: bytes) -> str:
    """Check the raw request bytes with the one body rule shared with ``enqueue()``
    (:func:`orbit_tasks.json_document.check_document`) and return the text to store (the bytes
    decoded as UTF-8). 413 ``too_large`` over 1 MiB; 400 ``bad_json`` for everything else."""
    try:
        text, _doc = json_document.check_document(raw, subject="request body")
    except json_document.DocumentProblem as exc:
        if exc.code == "too_large":
            raise too_large(len(raw)) from None
        raise ApiProblem(400, "bad_json", exc.message) from None
    return text


def request_sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


# --- receipts -------------------------------------------------------------------------------------


def format_time(value: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` of a naive UTC datetime."""
    if value.tzinfo is not None:
        raise ValueError("expected a naive UTC datetime")
    return format_ts(value)


def build_receipt(
    *,
    task_id: bytes,
    namespace_id: bytes,
    queue_id: bytes,
    idempotency_key: str,
    accepted_at: datetime,
) -> str:
    """The acceptance receipt as canonical JSON text (stored and replayed byte-exact)."""
    return canonical_json(
        {
            "accepted_at": format_time(accepted_at),
            "idempotency_key": idempotency_key,
            "namespace_id": namespace_id.hex(),
            "queue_id": queue_id.hex(),
            "task_id": task_id.hex(),
        }
    )


def receipt_queue_id(receipt_text: str) -> str:
    """The queue id (hex) a stored receipt was issued for."""
    value = json.loads(receipt_text)
    queue_id = value.get("queue_id") if isinstance(value, dict) else None
    if not isinstance(queue_id, str) or not _HEX32.match(queue_id):
        raise ValueError("stored receipt has no valid queue_id")
    return queue_id


def expires_at(accepted_at: datetime) -> datetime:
    return accepted_at + IDEMPOTENCY_RETENTION


def replay_decision(
    *, stored_sha256: str, stored_queue_hex: str, request_sha: str, queue_hex: str
) -> bool:
    """True = replay the stored receipt; False = the key was used for another request (409).

    A key names one request: the same body bytes sent to the same queue."""
    return stored_sha256 == request_sha and stored_queue_hex == queue_hex


def conflict() -> ApiProblem:
    return ApiProblem(
        409,
        "idempotency_conflict",
        "this Idempotency-Key was already used for a different request body or queue",
    )
