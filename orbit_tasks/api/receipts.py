"""Pure rules of the reference platform API: request validation and acceptance receipts.

No I/O here. The raw request bytes are what the platform stores (decoded as UTF-8, never
re-serialized); parsing only *checks* them, with ``Decimal`` for every number so that a value
such as ``12345678901234567890.123456789`` or ``1e400`` is never squeezed through a float.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

MAX_BODY_BYTES = 1024 * 1024  # 1 MiB
MAX_KEY_LENGTH = 128
IDEMPOTENCY_RETENTION = timedelta(hours=72)
RECEIPT_FIELDS = ("accepted_at", "idempotency_key", "namespace_id", "queue_id", "task_id")

# Printable ASCII (0x20..0x7E); no space at either end (HTTP strips it, and MariaDB's PAD SPACE
# collations would treat "k" and "k " as the same key).
_KEY = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


class ApiProblem(Exception):
    """An HTTP error answer: status, stable code and a short message (never the body/token)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> bytes:
        return canonical_json({"error": self.code, "message": self.message}).encode("utf-8")


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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError("duplicate object key")
        obj[key] = value
    return obj


def parse_exact(text: str) -> Any:
    """Parse JSON text with exact numbers (``Decimal``); refuses NaN/Infinity and duplicate keys.

    Raises ``ValueError`` (including ``json.JSONDecodeError``) or ``RecursionError``."""
    return json.loads(
        text,
        parse_float=Decimal,
        parse_int=Decimal,
        parse_constant=_no_constant,
        object_pairs_hook=_object_without_duplicates,
    )


def validate_body(raw: bytes) -> str:
    """Check the raw request bytes and return the text to store (the bytes decoded as UTF-8).

    413 over 1 MiB; 400 ``bad_json`` for invalid UTF-8, invalid JSON, duplicate keys or a value
    that is not a JSON object."""
    if len(raw) > MAX_BODY_BYTES:
        raise too_large(len(raw))
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise ApiProblem(
            400, "bad_json", f"request body is not valid UTF-8 (byte offset {exc.start})"
        ) from None
    try:
        value = parse_exact(text)
    except json.JSONDecodeError as exc:
        raise ApiProblem(
            400, "bad_json", f"request body is not valid JSON ({exc.msg} at char {exc.pos})"
        ) from None
    except RecursionError:
        raise ApiProblem(400, "bad_json", "request body is nested too deeply") from None
    except ValueError as exc:
        # Our own hooks: duplicate keys, NaN/Infinity. Their messages hold no body content.
        raise ApiProblem(400, "bad_json", f"request body is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ApiProblem(
            400, "bad_json", f"request body must be a JSON object, not {_json_type(value)}"
        )
    return text


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def request_sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


# --- receipts -------------------------------------------------------------------------------------


def format_time(value: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` of a naive UTC datetime."""
    if value.tzinfo is not None:
        raise ValueError("expected a naive UTC datetime")
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
