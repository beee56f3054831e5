"""Pure sender rules: classification of every status and transport error, backoff bounds,
Retry-After, deadline arithmetic at exact boundaries, digest."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random

import pytest

from orbit_tasks.sender import policy

NS = "a" * 32
Q = "b" * 32
KEY = "op-" + "c" * 32
TASK = "d" * 32
NOW = dt.datetime(2026, 1, 1, 12, 0, 0, 0)
DEADLINE = NOW + dt.timedelta(hours=1)


def receipt(**over: object) -> bytes:
    doc = {
        "accepted_at": "2026-01-01T12:00:00.000000Z",
        "idempotency_key": KEY,
        "namespace_id": NS,
        "queue_id": Q,
        "task_id": TASK,
    }
    doc.update(over)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def classify(status: int, body: bytes = b"", retry_after: float | None = None) -> policy.Outcome:
    return policy.classify_response(
        status, body, namespace_id=NS, queue_id=Q, key=KEY, retry_after=retry_after
    )


def err(code: str) -> bytes:
    return json.dumps({"error": code, "message": "x"}).encode()


@pytest.mark.parametrize("status", [200, 201])
def test_valid_receipt_is_accepted_with_exact_text(status: int) -> None:
    body = receipt()
    out = classify(status, body)
    assert (out.kind, out.code, out.task_id) == ("accepted", "ACCEPTED", TASK)
    assert out.receipt_json == body.decode()


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b"\xff\xfe",
        receipt(task_id="D" * 32),
        receipt(task_id="d" * 31),
        receipt(task_id=None),
        receipt(namespace_id="e" * 32),
        receipt(queue_id="e" * 32),
        receipt(idempotency_key="op-" + "e" * 32),
        # the receipt has five fields; accepted_at is one of them
        receipt(accepted_at=None),
        receipt().replace(b'"accepted_at":"2026-01-01T12:00:00.000000Z",', b""),
        # what ck_sender_receipt (JSON_VALID) cannot store: an escaped lone surrogate, deep nesting
        receipt(note="\ud800"),
        receipt(extra=json.loads("[" * 31 + "]" * 31)),
    ],
)
@pytest.mark.parametrize("status", [200, 201])
def test_2xx_without_a_valid_receipt_is_protocol_review(status: int, body: bytes) -> None:
    out = classify(status, body)
    assert (out.kind, out.code, out.task_id, out.receipt_json) == ("review", "PROTOCOL", None, None)


@pytest.mark.parametrize("status", [202, 204, 206, 299])
def test_other_2xx_even_with_receipt_is_protocol(status: int) -> None:
    assert classify(status, receipt()).code == "PROTOCOL"


@pytest.mark.parametrize(
    ("status", "body", "kind", "code"),
    [
        (401, err("unauthenticated"), "retry", "UNAUTHENTICATED"),
        (403, err("forbidden"), "review", "FORBIDDEN"),
        (404, err("queue_not_found"), "review", "QUEUE_NOT_FOUND"),
        (400, err("bad_json"), "review", "REJECTED"),
        (422, err("validation"), "review", "REJECTED"),
        (422, b"", "review", "REJECTED"),
        (413, err("too_large"), "review", "TOO_LARGE"),
        (409, err("idempotency_conflict"), "review", "IDEMPOTENCY_CONFLICT"),
        (422, err("idempotency_conflict"), "review", "IDEMPOTENCY_CONFLICT"),
        (409, b"garbage", "review", "IDEMPOTENCY_CONFLICT"),
        (409, err("request_in_progress"), "retry", "IN_PROGRESS"),
        (408, b"", "retry", "UNAVAILABLE"),
        (425, b"", "retry", "UNAVAILABLE"),
        (500, b"", "retry", "UNAVAILABLE"),
        (502, b"<html>", "retry", "UNAVAILABLE"),
        (503, err("x"), "retry", "UNAVAILABLE"),
        (504, b"", "retry", "UNAVAILABLE"),
        (599, b"", "retry", "UNAVAILABLE"),
        (429, err("throttled"), "retry", "THROTTLED"),
        (405, b"", "review", "REJECTED"),
        (410, b"", "review", "REJECTED"),
        (301, b"", "review", "PROTOCOL"),
        (302, receipt(), "review", "PROTOCOL"),
        (100, b"", "review", "PROTOCOL"),
        (600, b"", "review", "PROTOCOL"),
    ],
)
def test_every_status_class(status: int, body: bytes, kind: str, code: str) -> None:
    out = classify(status, body)
    assert (out.kind, out.code) == (kind, code)
    assert out.task_id is None and out.receipt_json is None


def test_every_status_maps_to_a_known_code() -> None:
    for status in range(100, 700):
        out = classify(status, err("request_in_progress"))
        assert out.code in policy.ALL_CODES
        assert (out.code in policy.RETRY_CODES) == (out.kind == "retry")
        assert (out.code in policy.REVIEW_CODES) == (out.kind == "review")


def test_transport_errors() -> None:
    assert policy.classify_transport("network") == policy.Outcome("retry", "NETWORK")
    assert policy.classify_transport("timeout") == policy.Outcome("retry", "TIMEOUT")


def test_retry_after_travels_with_retryable_outcomes() -> None:
    assert classify(429, b"", retry_after=7.0).retry_after == 7.0
    assert classify(503, b"", retry_after=3.0).retry_after == 3.0
    assert classify(403, b"", retry_after=3.0).retry_after is None


def test_outcome_refuses_unknown_codes() -> None:
    with pytest.raises(AssertionError):
        policy.Outcome("review", "Internal Server Error: secret")


# --- Retry-After --------------------------------------------------------------------------------


def test_parse_retry_after_seconds_and_dates() -> None:
    assert policy.parse_retry_after(None, NOW) is None
    assert policy.parse_retry_after("0", NOW) == 0.0
    assert policy.parse_retry_after(" 120 ", NOW) == 120.0
    assert policy.parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", NOW) == 30.0
    assert policy.parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", NOW) == 0.0
    assert policy.parse_retry_after("soon", NOW) is None
    assert policy.parse_retry_after("-5", NOW) is None
    assert policy.parse_retry_after("1.5", NOW) is None


def test_parse_retry_after_never_raises_on_odd_values() -> None:
    """A header is the server's text: non-ASCII digits and absurd lengths are not exceptions."""
    assert policy.parse_retry_after("\u00b2", NOW) is None  # str.isdigit() is True for it
    assert policy.parse_retry_after("\u0661\u0662", NOW) is None  # Arabic-Indic digits
    huge = policy.parse_retry_after("9" * 5000, NOW)  # over int()'s 4300-digit limit
    assert huge == policy.MAX_RETRY_AFTER_SECONDS


MAX = policy.MAX_RETRY_AFTER_SECONDS


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("99999999999999999999", MAX),  # huge: was inf, a hold for the life of the process
        ("9" * 400, MAX),
        ("0000000000000000000000000030", 30.0),  # leading zeros are not a huge value
        ("601", MAX),
        ("600", MAX),
        ("-5", None),  # negative: unreadable, the backoff applies
        ("1.5", None),  # fractional
        ("", None),  # empty
        ("soon", None),  # garbage
        ("Thu, 01 Jan 2026 11:00:00 GMT", 0.0),  # an HTTP date in the past
        ("Thu, 01 Jan 2026 12:05:00 GMT", 300.0),  # in the future
        ("Fri, 01 Jan 9999 12:00:00 GMT", MAX),  # far in the future
    ],
)
def test_retry_after_is_bounded_by_a_documented_maximum(header: str, seconds: float | None) -> None:
    """Issue 23 item 4: every value a server sends is bounded before use."""
    assert policy.parse_retry_after(header, NOW) == seconds


@pytest.mark.parametrize("header", ["99999999999999", "9" * 400, "9" * 5000])
def test_a_huge_retry_after_never_takes_the_last_try(header: str) -> None:
    """Before: a Retry-After past the deadline sent the row to REVIEW at once. Now it is bounded
    and a row that would wait past its last slot gets the last slot instead."""
    seconds = policy.parse_retry_after(header, NOW)
    wake = NOW + dt.timedelta(seconds=policy.MAX_RETRY_AFTER_SECONDS)
    assert policy.next_wake(NOW, DEADLINE, 1, Fixed(0.0), seconds) == wake
    soon = NOW + dt.timedelta(seconds=30)
    last = policy.last_slot(soon, 5.0)
    assert policy.after_retryable(NOW, soon, 1, Fixed(0.0), seconds, 5.0) == (last, None)


# --- backoff ------------------------------------------------------------------------------------


def test_backoff_cap_grows_exponentially_then_caps() -> None:
    assert [policy.backoff_cap(n) for n in (0, 1, 2, 3, 4)] == [1.0, 1.0, 2.0, 4.0, 8.0]
    assert policy.backoff_cap(9) == 256.0
    assert policy.backoff_cap(10) == policy.BACKOFF_CAP_SECONDS
    assert policy.backoff_cap(100) == policy.BACKOFF_CAP_SECONDS


class Fixed:
    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.fraction


@pytest.mark.parametrize("send_count", [1, 2, 5, 12, 99])
def test_full_jitter_stays_within_zero_and_cap(send_count: int) -> None:
    rng = random.Random(send_count)
    far = NOW + dt.timedelta(days=1)
    cap = dt.timedelta(seconds=policy.backoff_cap(send_count))
    delays = []
    for _ in range(500):
        wake = policy.next_wake(NOW, far, send_count, rng)
        assert wake is not None
        assert NOW <= wake <= NOW + cap
        delays.append(wake - NOW)
    assert min(delays) < cap / 4 and max(delays) > cap * 3 / 4  # really spread over [0, cap]
    assert policy.next_wake(NOW, far, send_count, Fixed(0.0)) == NOW
    assert policy.next_wake(NOW, far, send_count, Fixed(1.0)) == NOW + cap


def test_retry_after_is_a_floor() -> None:
    far = NOW + dt.timedelta(days=1)
    assert policy.next_wake(NOW, far, 1, Fixed(0.5), 30.0) == NOW + dt.timedelta(seconds=30)
    # jitter above Retry-After wins
    assert policy.next_wake(NOW, far, 9, Fixed(0.5), 30.0) == NOW + dt.timedelta(seconds=128)


def test_wake_is_clamped_before_the_deadline() -> None:
    deadline = NOW + dt.timedelta(seconds=10)
    wake = policy.next_wake(NOW, deadline, 9, Fixed(1.0))
    assert wake == deadline - policy.LAST_TRY_MARGIN
    assert wake is not None and wake < deadline


def test_retry_after_past_the_last_slot_is_the_last_slot() -> None:
    deadline = NOW + dt.timedelta(seconds=10)
    last = deadline - policy.LAST_TRY_MARGIN
    assert policy.next_wake(NOW, deadline, 1, Fixed(0.0), 10.0) == last
    assert policy.next_wake(NOW, deadline, 1, Fixed(0.0), 11.0) == last
    assert policy.next_wake(NOW, deadline, 1, Fixed(0.0), 9.0) == last  # inside the last 2 s
    assert policy.next_wake(NOW, deadline, 1, Fixed(0.0), 8.0) == NOW + dt.timedelta(seconds=8)
    # the HTTP bound moves the last slot earlier by as much
    assert policy.next_wake(NOW, deadline, 1, Fixed(0.0), 8.0, 3.0) == last - dt.timedelta(
        seconds=3
    )


def test_no_retry_at_or_after_the_deadline() -> None:
    assert policy.next_wake(DEADLINE, DEADLINE, 1, Fixed(0.0)) is None
    assert policy.next_wake(DEADLINE + dt.timedelta(microseconds=1), DEADLINE, 1, Fixed(0)) is None
    last_slot = DEADLINE - policy.LAST_TRY_MARGIN
    assert policy.next_wake(last_slot, DEADLINE, 1, Fixed(0.0)) == last_slot
    assert policy.next_wake(last_slot + dt.timedelta(microseconds=1), DEADLINE, 1, Fixed(0)) is None


@pytest.mark.parametrize("http", [0.0, 1.5, 10.0])
def test_no_send_starts_unless_the_http_bound_and_the_margin_fit(http: float) -> None:
    """Issue 23 item 3: a send starts only when the whole HTTP bound plus LAST_SEND_MARGIN fits
    before the deadline."""
    cutoff = DEADLINE - dt.timedelta(seconds=http) - policy.LAST_SEND_MARGIN
    assert policy.send_cutoff(DEADLINE, http) == cutoff
    assert not policy.too_late_to_send(cutoff - dt.timedelta(microseconds=1), DEADLINE, http)
    assert policy.too_late_to_send(cutoff, DEADLINE, http)
    assert policy.too_late_to_send(DEADLINE, DEADLINE, http)
    # the last retry slot leaves time to claim the row before the cut-off
    assert cutoff > policy.last_slot(DEADLINE, http)
    assert policy.claim_guard(cutoff, 0, DEADLINE, http) == "DEADLINE_EXCEEDED"
    assert policy.claim_guard(cutoff - dt.timedelta(microseconds=1), 0, DEADLINE, http) is None


# --- guards -------------------------------------------------------------------------------------


def test_deadline_boundary_now_equal_is_past() -> None:
    assert policy.deadline_passed(DEADLINE, DEADLINE)
    assert not policy.deadline_passed(DEADLINE - dt.timedelta(microseconds=1), DEADLINE)
    assert policy.claim_guard(DEADLINE, 0, DEADLINE, 0.0) == "DEADLINE_EXCEEDED"
    cutoff = DEADLINE - policy.LAST_SEND_MARGIN
    assert policy.claim_guard(cutoff - dt.timedelta(microseconds=1), 0, DEADLINE, 0.0) is None


def test_attempts_guard() -> None:
    assert policy.claim_guard(NOW, 99, DEADLINE, 1.0) is None
    assert policy.claim_guard(NOW, 100, DEADLINE, 1.0) == "ATTEMPTS_EXHAUSTED"
    assert policy.claim_guard(DEADLINE, 100, DEADLINE, 1.0) == "DEADLINE_EXCEEDED"


def test_requeue_refusals() -> None:
    assert policy.requeue_refusal(NOW, "REVIEW", 99, DEADLINE) == ""
    assert "100" in policy.requeue_refusal(NOW, "REVIEW", 100, DEADLINE)
    assert "deadline" in policy.requeue_refusal(DEADLINE, "REVIEW", 1, DEADLINE)
    for state in ("PENDING", "SENDING", "ACCEPTED"):
        assert state in policy.requeue_refusal(NOW, state, 1, DEADLINE)


def test_presend_check() -> None:
    body = '{"n":1.10}'
    args = dict(
        stored_digest=policy.digest(body),
        request_json=body,
        operation_id="c" * 32,
        key=KEY,
        row_namespace=NS,
        row_queue=Q,
        identity_namespace=NS,
        identity_queues=frozenset({Q}),
    )
    assert policy.presend_check(**args) is None  # type: ignore[arg-type]
    assert policy.presend_check(**{**args, "request_json": '{"n":1.1}'}) == "DIGEST_MISMATCH"  # type: ignore[arg-type]
    assert policy.presend_check(**{**args, "identity_queues": frozenset()}) == "QUEUE_FORBIDDEN"  # type: ignore[arg-type]
    assert (
        policy.presend_check(**{**args, "identity_namespace": "e" * 32})  # type: ignore[arg-type]
        is policy.ReleaseReason.OTHER_NAMESPACE
    )
    # The frozen key: "op-" + operation id, nothing else.
    assert policy.presend_check(**{**args, "key": "op-" + "e" * 32}) == "DIGEST_MISMATCH"  # type: ignore[arg-type]
    assert policy.presend_check(**{**args, "key": "c" * 32}) == "DIGEST_MISMATCH"  # type: ignore[arg-type]


def test_digest_is_raw_sha256_of_utf8_bytes() -> None:
    text = '{"emoji":"😀","n":0.1000000000000000000001}'
    assert policy.digest(text) == hashlib.sha256(text.encode("utf-8")).digest()
    assert len(policy.digest(text)) == 32
    assert policy.idempotency_key("f" * 32) == "op-" + "f" * 32


def test_exact_numbers_survive_parsing() -> None:
    doc = policy.parse_json_exact('{"a":0.1000000000000000000001,"b":123456789012345678901234567}')
    assert str(doc["a"]) == "0.1000000000000000000001"
    assert doc["b"] == 123456789012345678901234567
    with pytest.raises(ValueError):
        policy.parse_json_exact('{"a":NaN}')


def test_after_retryable() -> None:
    assert policy.after_retryable(NOW, DEADLINE, 1, Fixed(0.0)) == (NOW, None)
    assert policy.after_retryable(NOW, DEADLINE, 99, Fixed(0.0)) == (NOW, None)
    assert policy.after_retryable(NOW, DEADLINE, 100, Fixed(0.0)) == (None, "ATTEMPTS_EXHAUSTED")
    assert policy.after_retryable(DEADLINE, DEADLINE, 1, Fixed(0.0)) == (None, "DEADLINE_EXCEEDED")
    # a hold never takes the last try: a wait past the last slot is the last slot
    assert policy.after_retryable(NOW, DEADLINE, 1, Fixed(0.0), 3600.0) == (
        DEADLINE - policy.LAST_TRY_MARGIN,
        None,
    )


@pytest.mark.parametrize("status", [200, 201, 409, 422])
def test_deeply_nested_bodies_are_classified_not_raised(status: int) -> None:
    """json.loads raises RecursionError (not ValueError) past ~1000 levels; an odd server body
    must still get its fixed code instead of failing the outcome write."""
    body = b"[" * 100_000 + b"]" * 100_000
    out = classify(status, body)
    assert out.kind == "review" and out.code in policy.REVIEW_CODES
