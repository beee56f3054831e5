"""Pure sender rules (SPEC §8): classification of every HTTP/transport outcome, capped exponential
backoff with full jitter, ``Retry-After``, deadline and attempt guards.

No I/O here: every function receives ``now`` (the database clock) and values, so the rules can be
tested at exact boundaries. ``last_code`` only ever holds one of :data:`ALL_CODES`.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import enum
import hashlib
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, Protocol

from orbit_tasks import json_document, sender_limits, units
from orbit_tasks.backoff import exponential_cap
from orbit_tasks.timestamps import format_ts

# --- codes -------------------------------------------------------------------------------------


class LastCode(enum.StrEnum):
    """``last_code`` of an outbox row (like the archive's ``ErrorCode``)."""

    NEW = "NEW"
    ACCEPTED = "ACCEPTED"
    # retry later (PENDING, wake_at = backoff)
    NETWORK = "NETWORK"
    TIMEOUT = "TIMEOUT"
    UNAVAILABLE = "UNAVAILABLE"
    THROTTLED = "THROTTLED"
    IN_PROGRESS = "IN_PROGRESS"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    # REVIEW (a person looks at it; `orbit sender requeue` puts it back)
    FORBIDDEN = "FORBIDDEN"
    QUEUE_NOT_FOUND = "QUEUE_NOT_FOUND"
    REJECTED = "REJECTED"
    TOO_LARGE = "TOO_LARGE"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    PROTOCOL = "PROTOCOL"
    DIGEST_MISMATCH = "DIGEST_MISMATCH"
    QUEUE_FORBIDDEN = "QUEUE_FORBIDDEN"
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


RETRY_CODES = frozenset(
    {
        LastCode.NETWORK,
        LastCode.TIMEOUT,
        LastCode.UNAVAILABLE,
        LastCode.THROTTLED,
        LastCode.IN_PROGRESS,
        LastCode.UNAUTHENTICATED,
    }
)
REVIEW_CODES = frozenset(
    {
        LastCode.FORBIDDEN,
        LastCode.QUEUE_NOT_FOUND,
        LastCode.REJECTED,
        LastCode.TOO_LARGE,
        LastCode.IDEMPOTENCY_CONFLICT,
        LastCode.PROTOCOL,
        LastCode.DIGEST_MISMATCH,
        LastCode.QUEUE_FORBIDDEN,
        LastCode.ATTEMPTS_EXHAUSTED,
        LastCode.DEADLINE_EXCEEDED,
    }
)
ALL_CODES = frozenset({LastCode.NEW, LastCode.ACCEPTED}) | RETRY_CODES | REVIEW_CODES


class OutboxState(enum.StrEnum):
    """``state`` of an outbox row (like the archive's ``JobState``)."""

    PENDING = "PENDING"
    SENDING = "SENDING"
    ACCEPTED = "ACCEPTED"
    REVIEW = "REVIEW"


STATES = tuple(s.value for s in OutboxState)
MAX_SENDS = 100
SEND_WINDOW = dt.timedelta(hours=24)

# Backoff: full jitter over [0, min(CAP, BASE * 2**(n-1))] seconds for the n-th send.
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 300.0
# "Never sent after its deadline" (issue 23 item 3): a send *starts* only when the whole HTTP
# bound (connect + send + answer, ``ORBIT_SENDER_HTTP_TIMEOUT_SECONDS``) plus LAST_SEND_MARGIN
# (clock differences between the sender, the business and the platform database) fits before the
# deadline, so an exchange the platform answers within the bound cannot create the task after it.
# A retry that would land later than LAST_TRY_MARGIN before that cut-off gets its one last try
# there instead (leaving time to claim it before the cut-off).
LAST_SEND_MARGIN = dt.timedelta(seconds=1)
LAST_TRY_MARGIN = 2 * LAST_SEND_MARGIN

_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def is_hex32(value: object) -> bool:
    return isinstance(value, str) and bool(_HEX32.match(value))


def digest(request_json: str) -> bytes:
    """The outbox digest: raw SHA-256 of the frozen body's UTF-8 bytes."""
    return hashlib.sha256(request_json.encode("utf-8")).digest()


def idempotency_key(operation_id: str) -> str:
    return "op-" + operation_id


# --- guards ------------------------------------------------------------------------------------


def deadline_passed(now: dt.datetime, deadline: dt.datetime) -> bool:
    """``now == deadline`` is already past: nothing is sent at or after the deadline."""
    return now >= deadline


def send_cutoff(deadline: dt.datetime, http_seconds: float) -> dt.datetime:
    """The last moment (exclusive) a send may start: the deadline minus the whole HTTP bound and
    LAST_SEND_MARGIN."""
    return deadline - dt.timedelta(seconds=http_seconds) - LAST_SEND_MARGIN


def too_late_to_send(now: dt.datetime, deadline: dt.datetime, http_seconds: float) -> bool:
    """A send may start only while ``now + http_seconds + LAST_SEND_MARGIN < deadline``."""
    return now >= send_cutoff(deadline, http_seconds)


def claim_guard(
    now: dt.datetime, send_count: int, deadline: dt.datetime, http_seconds: float
) -> str | None:
    """The REVIEW code a due row gets instead of a claim, or None when it may be claimed. A row
    that no send may start for any more (:func:`too_late_to_send`) is not claimed."""
    if too_late_to_send(now, deadline, http_seconds):
        return LastCode.DEADLINE_EXCEEDED
    if send_count >= MAX_SENDS:
        return LastCode.ATTEMPTS_EXHAUSTED
    return None


def requeue_refusal(now: dt.datetime, state: str, send_count: int, deadline: dt.datetime) -> str:
    """Why a row may not be requeued ("" when it may)."""
    if state != OutboxState.REVIEW:
        return f"state is {state}; only REVIEW rows can be requeued"
    if deadline_passed(now, deadline):
        return f"send deadline {format_ts(deadline)} has passed (now {format_ts(now)})"
    if send_count >= MAX_SENDS:
        return f"send_count {send_count} reached the limit of {MAX_SENDS} sends"
    return ""


# --- retention and resolutions (docs/sender.md "Retention", "Dead letters") ----------------------

MAX_REASON_CHARS = 500
MAX_ACTOR_CHARS = 128


def retention_refusal(seconds: int, what: str, shown: str | None = None) -> str:
    """Why ``seconds`` (written ``shown``) is not a retention ("" when it is)."""
    if not sender_limits.MIN_RETENTION_SECONDS <= seconds <= sender_limits.MAX_RETENTION_SECONDS:
        value = f"{seconds}s" if shown is None else shown
        return f"{what} {value} is out of range (allowed {sender_limits.RETENTION_RANGE})"
    return ""


def parse_retention(text: str, what: str) -> tuple[int, str]:
    """``(seconds, why)`` of a retention given as text (``7d``: digits and a unit, always);
    ``why`` names the value and the allowed range when it is refused ("" when it is not)."""
    # digits and a unit, always: a bare 7 meant as days would prune everything older than 7 s;
    # and nothing else: "1s " (a stray space) is not what the operator meant to type either
    spaced = any(ch.isspace() for ch in text)
    seconds = None if spaced else units.duration_seconds(text, unit_required=True)
    shown = text if len(text) <= 40 else f"{text[:16]}...({len(text)} characters)"
    if seconds is None:
        return 0, (
            f"{what} {shown!r} is not a duration; use an integer with s, m, h or d, e.g. 7d, "
            f"without spaces (allowed {sender_limits.RETENTION_RANGE})"
        )
    return seconds, retention_refusal(seconds, what, shown.strip())


def resolution_current(
    state: str, updated_at: dt.datetime, review_since: dt.datetime | None
) -> bool:
    """A resolution holds for the REVIEW row it was recorded on: the row is still in REVIEW and
    unchanged since (``updated_at`` as it was; a requeue or any later write changes it)."""
    return state == OutboxState.REVIEW and review_since is not None and review_since == updated_at


def prunable(
    state: str, updated_at: dt.datetime, resolved_at: dt.datetime | None, cutoff: dt.datetime
) -> bool:
    """ACCEPTED rows last changed before ``cutoff``, and REVIEW rows whose current resolution
    (``resolved_at``, None when unresolved) was recorded before it. Never PENDING or SENDING."""
    if state == OutboxState.ACCEPTED:
        return updated_at < cutoff
    if state == OutboxState.REVIEW:
        return resolved_at is not None and resolved_at < cutoff
    return False


def reason_refusal(reason: str) -> str:
    """Why ``reason`` cannot be recorded ("" when it can): the one reason rule (units.py)."""
    return units.text_refusal(reason, "--reason", MAX_REASON_CHARS)


# --- classification ----------------------------------------------------------------------------


class OutcomeKind(enum.StrEnum):
    """What an HTTP outcome makes of a row: ACCEPTED, due again later, or REVIEW."""

    ACCEPTED = "accepted"
    RETRY = "retry"
    REVIEW = "review"


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    code: LastCode
    task_id: str | None = None
    receipt_json: str | None = None
    retry_after: float | None = None  # seconds, from the Retry-After header

    def __post_init__(self) -> None:
        assert self.code in ALL_CODES, self.code


def _retry(code: LastCode, retry_after: float | None = None) -> Outcome:
    return Outcome(OutcomeKind.RETRY, code, retry_after=retry_after)


def _review(code: LastCode) -> Outcome:
    return Outcome(OutcomeKind.REVIEW, code)


def classify_transport(kind: Literal["network", "timeout"]) -> Outcome:
    """No HTTP response: a connection error or a timeout (either may follow a commit)."""
    return _retry(LastCode.TIMEOUT if kind == "timeout" else LastCode.NETWORK)


def _no_constants(name: str) -> Any:
    raise ValueError(f"JSON constant {name} is not allowed")


def parse_json_exact(text: str) -> Any:
    """Parse JSON keeping every number exact (Decimal) and refusing NaN/Infinity."""
    return json.loads(text, parse_float=Decimal, parse_constant=_no_constants)


def _error_code(body: bytes) -> str:
    """The ``error`` field of a JSON error body, or "" (never stored, only compared)."""
    try:
        doc = parse_json_exact(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return ""
    value = doc.get("error") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else ""


def valid_receipt(
    body: bytes, namespace_id: str, queue_id: str, key: str
) -> tuple[str, str] | None:
    """(task_id, receipt text) when ``body`` is a receipt for exactly this submission."""
    try:
        # The one document rule (also what ck_sender_receipt can store): never written otherwise.
        text, doc = json_document.check_document(body, subject="receipt")
    except json_document.DocumentProblem:
        return None
    if not isinstance(doc.get("accepted_at"), str):
        return None
    task_id = doc.get("task_id")
    if not is_hex32(task_id):
        return None
    if (
        doc.get("namespace_id") != namespace_id
        or doc.get("queue_id") != queue_id
        or doc.get("idempotency_key") != key
    ):
        return None
    assert isinstance(task_id, str)
    return task_id, text


# The longest wait a Retry-After can ask for (issue 23 item 4): a larger value (a huge number,
# 400 digits, a date years ahead) is read as this many seconds, so a server's header can never
# freeze a queue; a row's own deadline bounds it further (:func:`next_wake`).
MAX_RETRY_AFTER_SECONDS = 600.0


def parse_retry_after(value: str | None, now: dt.datetime) -> float | None:
    """``Retry-After`` as seconds from ``now``, at most MAX_RETRY_AFTER_SECONDS: delta-seconds
    (ASCII digits) or an HTTP date; None if absent or unreadable (negative, fractional, empty,
    garbage); a date in the past is 0."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        # Compared as text length first: int() refuses over 4,300 digits, float() makes inf.
        if len(value.lstrip("0")) > 6:
            return MAX_RETRY_AFTER_SECONDS
        return min(float(value), MAX_RETRY_AFTER_SECONDS)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC).replace(tzinfo=None)
    return min(max(0.0, (when - now).total_seconds()), MAX_RETRY_AFTER_SECONDS)


def hold_until(
    now: dt.datetime,
    asked_seconds: float,
    earliest_deadline: dt.datetime | None,
    http_seconds: float,
) -> dt.datetime | None:
    """The end of a queue hold a ``Retry-After`` of ``asked_seconds`` (already bounded by
    MAX_RETRY_AFTER_SECONDS) asks for, bounded by the last retry slot of the queue's earliest
    deadline, so that a hold never keeps a row from its last try. None: no hold (nothing asked,
    or that last slot has come)."""
    if asked_seconds <= 0:
        return None
    until = now + dt.timedelta(seconds=min(asked_seconds, MAX_RETRY_AFTER_SECONDS))
    if earliest_deadline is not None:
        until = min(until, last_slot(earliest_deadline, http_seconds))
    return until if until > now else None


def classify_response(
    status: int,
    body: bytes,
    *,
    namespace_id: str,
    queue_id: str,
    key: str,
    retry_after: float | None = None,
) -> Outcome:
    """Map one HTTP response of ``POST .../tasks`` to its outcome (SPEC §8 step 4)."""
    if 200 <= status < 300:
        if status in (200, 201):
            found = valid_receipt(body, namespace_id, queue_id, key)
            if found is not None:
                return Outcome(
                    OutcomeKind.ACCEPTED, LastCode.ACCEPTED, task_id=found[0], receipt_json=found[1]
                )
        return _review(LastCode.PROTOCOL)
    if status == 401:
        return _retry(LastCode.UNAUTHENTICATED, retry_after)
    if status == 403:
        return _review(LastCode.FORBIDDEN)
    if status == 404:
        return _review(LastCode.QUEUE_NOT_FOUND)
    if status == 413:
        return _review(LastCode.TOO_LARGE)
    if status == 429:
        return _retry(LastCode.THROTTLED, retry_after)
    if status in (408, 425) or 500 <= status < 600:
        return _retry(LastCode.UNAVAILABLE, retry_after)
    if status == 409:
        if _error_code(body) == "request_in_progress":
            return _retry(LastCode.IN_PROGRESS, retry_after)
        # Any other 409 on this endpoint is a key clash: never retried blindly.
        return _review(LastCode.IDEMPOTENCY_CONFLICT)
    if status == 422:
        if _error_code(body) == "idempotency_conflict":
            return _review(LastCode.IDEMPOTENCY_CONFLICT)
        return _review(LastCode.REJECTED)
    if 400 <= status < 500:
        return _review(LastCode.REJECTED)
    # 1xx/3xx (redirects are not followed) or nonsense: the platform did not speak the protocol.
    return _review(LastCode.PROTOCOL)


# --- backoff -----------------------------------------------------------------------------------


class RandomSource(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def backoff_cap(send_count: int) -> float:
    """Upper bound of the jittered delay after the ``send_count``-th send (1-based)."""
    return exponential_cap(send_count - 1, base=BACKOFF_BASE_SECONDS, cap=BACKOFF_CAP_SECONDS)


def last_slot(deadline: dt.datetime, http_seconds: float) -> dt.datetime:
    """The latest ``wake_at`` of a retry: LAST_TRY_MARGIN before the deadline minus the HTTP
    bound, one LAST_SEND_MARGIN before the send cut-off (time to claim it)."""
    return deadline - dt.timedelta(seconds=http_seconds) - LAST_TRY_MARGIN


def next_wake(
    now: dt.datetime,
    deadline: dt.datetime,
    send_count: int,
    rng: RandomSource,
    retry_after: float | None = None,
    http_seconds: float = 0.0,
) -> dt.datetime | None:
    """When to try again: full jitter in ``[0, backoff_cap]``, not before ``Retry-After`` unless
    that is past the last slot (then the last slot: a hold never takes a row's last try away),
    never after :func:`last_slot`. ``None`` = no try fits (REVIEW ``DEADLINE_EXCEEDED``)."""
    last = last_slot(deadline, http_seconds)
    if now > last:
        return None
    room = (last - now).total_seconds()
    # Compared as seconds first: a huge Retry-After is the last slot, not an overflow.
    wait = min(max(0.0, retry_after or 0.0), room)
    earliest = now + dt.timedelta(seconds=wait)
    delay = rng.uniform(0.0, backoff_cap(send_count))
    wake = max(now + dt.timedelta(seconds=delay), earliest)
    return min(wake, last)


def after_retryable(
    now: dt.datetime,
    deadline: dt.datetime,
    send_count: int,
    rng: RandomSource,
    retry_after: float | None = None,
    http_seconds: float = 0.0,
) -> tuple[dt.datetime | None, LastCode | None]:
    """(wake_at, None) for another try, or (None, REVIEW code) when no further try is allowed:
    the 100th send was the last (``ATTEMPTS_EXHAUSTED``) or no try fits before the deadline."""
    if send_count >= MAX_SENDS:
        return None, LastCode.ATTEMPTS_EXHAUSTED
    wake = next_wake(now, deadline, send_count, rng, retry_after, http_seconds)
    if wake is None:
        return None, LastCode.DEADLINE_EXCEEDED
    return wake, None


# --- pre-send checks ---------------------------------------------------------------------------


class ReleaseReason(enum.StrEnum):
    """Why a claimed row is given back unsent (logged as ``reason`` of ``sender.row.released``)."""

    PASS_END = "pass_end"  # the exchange could not end before the pass must
    QUEUE_HELD = "queue_held"  # a Retry-After of its queue is running
    IDENTITY_UNAVAILABLE = "identity_unavailable"
    OTHER_NAMESPACE = "other_namespace"  # the credential now belongs to another namespace
    LEASE_SHORT = "lease_short"  # too little lease left for one bounded send
    SHUTDOWN = "shutdown"  # the worker is shutting down (SIGTERM): not sent, released at once


def presend_check(
    *,
    stored_digest: bytes,
    request_json: str,
    operation_id: str,
    key: str,
    row_namespace: str,
    row_queue: str,
    identity_namespace: str,
    identity_queues: frozenset[str],
) -> LastCode | ReleaseReason | None:
    """REVIEW code found before sending, :attr:`ReleaseReason.OTHER_NAMESPACE` when the row
    belongs to another namespace than the current credential (released, never sent by this
    credential), None when it may be sent.
    The key is part of the frozen request: a key that is not ``"op-" + operation_id`` (changed in
    the database) is never sent, like a body that no longer matches its digest."""
    if digest(request_json) != stored_digest or key != idempotency_key(operation_id):
        return LastCode.DIGEST_MISMATCH
    if row_namespace != identity_namespace:
        return ReleaseReason.OTHER_NAMESPACE
    if row_queue not in identity_queues:
        return LastCode.QUEUE_FORBIDDEN
    return None
