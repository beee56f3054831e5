"""Pure rules of the reference platform API: body and key validation, receipts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from orbit_tasks.api import receipts
from orbit_tasks.api.receipts import MAX_BODY_BYTES, ApiProblem


def problem(fn: Callable[..., object], *args: object) -> ApiProblem:
    with pytest.raises(ApiProblem) as info:
        fn(*args)
    return info.value


# --- body -----------------------------------------------------------------------------------------


def test_exact_decimals_are_parsed_without_float() -> None:
    text = '{"amount": 12345678901234567890.123456789, "big": 1e400, "tiny": -1E-400, "n": 7}'
    value = receipts.parse_exact(text)
    assert value["amount"] == Decimal("12345678901234567890.123456789")
    assert str(value["amount"]) == "12345678901234567890.123456789"
    assert value["big"] == Decimal("1e400")  # a float would be inf
    assert value["tiny"] == Decimal("-1E-400")  # a float would be -0.0
    assert isinstance(value["n"], Decimal)


def test_validate_body_returns_the_raw_text_unchanged() -> None:
    raw = ' {"b" :1.10,\t"a":[ 1e400 ,\r\n12345678901234567890.123456789],"s":"😀\\u00e9é"}\n'
    raw_bytes = raw.encode("utf-8")
    text = receipts.validate_body(raw_bytes)
    assert text.encode("utf-8") == raw_bytes


def test_huge_integer_beyond_int_digit_limit_is_accepted() -> None:
    raw = b'{"n": ' + b"9" * 5000 + b"}"
    assert receipts.validate_body(raw).encode() == raw


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"[1, 2]", "not an array"),
        (b'"text"', "not a string"),
        (b"12.5", "not a number"),
        (b"true", "not a boolean"),
        (b"null", "not null"),
    ],
)
def test_non_object_json_is_refused(raw: bytes, fragment: str) -> None:
    exc = problem(receipts.validate_body, raw)
    assert (exc.status, exc.code) == (400, "bad_json")
    assert fragment in exc.message


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b'{"a": 1,}',
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b"{'a': 1}",
        b'{"a": 1} {"b": 2}',
        b'{"a": "tab\tinside"}',
        "\ufeff{}".encode(),
    ],
)
def test_invalid_json_is_refused(raw: bytes) -> None:
    exc = problem(receipts.validate_body, raw)
    assert (exc.status, exc.code) == (400, "bad_json")


def test_duplicate_keys_are_refused_at_any_depth() -> None:
    for raw in (b'{"a": 1, "a": 1}', b'{"x": {"k": 1, "k": 2}}', b'{"l": [{"k": 1, "k": 1}]}'):
        exc = problem(receipts.validate_body, raw)
        assert exc.code == "bad_json"
        assert "duplicate" in exc.message
    # the same key in sibling objects is fine
    assert receipts.validate_body(b'{"a": {"k": 1}, "b": {"k": 1}}')


def test_invalid_utf8_is_refused_with_its_offset() -> None:
    exc = problem(receipts.validate_body, b'{"a": "\xff"}')
    assert (exc.status, exc.code) == (400, "bad_json")
    assert "UTF-8" in exc.message and "7" in exc.message


def test_deep_nesting_is_a_400_not_a_crash() -> None:
    raw = b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert len(raw) <= MAX_BODY_BYTES
    exc = problem(receipts.validate_body, raw)
    assert exc.code == "bad_json"


def test_size_limit_is_exactly_one_mebibyte() -> None:
    pad = MAX_BODY_BYTES - len(b'{"p":""}')
    at_limit = b'{"p":"' + b"x" * pad + b'"}'
    assert len(at_limit) == MAX_BODY_BYTES
    assert receipts.validate_body(at_limit)
    over = b'{"p":"' + b"x" * (pad + 1) + b'"}'
    exc = problem(receipts.validate_body, over)
    assert (exc.status, exc.code) == (413, "too_large")
    assert str(MAX_BODY_BYTES) in exc.message


def test_error_messages_never_echo_body_content() -> None:
    secret = "s3cr3t-value"
    for raw in (
        f'{{"{secret}": 1, "{secret}": 2}}',
        f'["{secret}"]',
        f'{{"a": "{secret}"',
    ):
        exc = problem(receipts.validate_body, raw.encode())
        assert secret not in exc.message
        assert secret.encode() not in exc.body()


def test_declared_content_length() -> None:
    assert receipts.content_length(None) is None
    assert receipts.content_length(str(MAX_BODY_BYTES)) == MAX_BODY_BYTES
    assert problem(receipts.content_length, str(MAX_BODY_BYTES + 1)).status == 413
    assert problem(receipts.content_length, "abc").status == 400
    assert problem(receipts.content_length, "-1").status == 400


# --- keys and tokens ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["k", "op-0123456789abcdef0123456789abcdef", "a b", "!~", "x" * 128, "A:b/c?d=e"]
)
def test_valid_keys(key: str) -> None:
    assert receipts.validate_idempotency_key(key) == key


@pytest.mark.parametrize(
    "key",
    [None, "", "x" * 129, " lead", "trail ", " ", "tab\tin", "é", "new\nline", "nul\x00", "\x7f"],
)
def test_invalid_keys(key: str | None) -> None:
    exc = problem(receipts.validate_idempotency_key, key)
    assert (exc.status, exc.code) == (400, "bad_idempotency_key")
    assert "128" in exc.message or "0x20..0x7E" in exc.message


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("BEARER orb_x-y", "orb_x-y")],
)
def test_bearer_token(header: str, token: str) -> None:
    assert receipts.bearer_token(header) == token


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic abc", "abc"])
def test_bad_authorization_is_401(header: str | None) -> None:
    exc = problem(receipts.bearer_token, header)
    assert (exc.status, exc.code) == (401, "unauthenticated")


# --- receipts -------------------------------------------------------------------------------------


def test_receipt_is_canonical_json() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 60)
    text = receipts.build_receipt(
        task_id=bytes(range(16)),
        namespace_id=b"\x01" * 16,
        queue_id=b"\xab" * 16,
        idempotency_key="op-1",
        accepted_at=at,
    )
    assert text == (
        '{"accepted_at":"2026-01-02T03:04:05.000060Z","idempotency_key":"op-1",'
        '"namespace_id":"01010101010101010101010101010101",'
        '"queue_id":"abababababababababababababababab",'
        '"task_id":"000102030405060708090a0b0c0d0e0f"}'
    )
    assert tuple(json.loads(text)) == receipts.RECEIPT_FIELDS
    assert receipts.receipt_queue_id(text) == "ab" * 16


def test_receipt_time_must_be_naive_utc() -> None:
    from datetime import UTC

    with pytest.raises(ValueError):
        receipts.format_time(datetime(2026, 1, 1, tzinfo=UTC))


def test_retention_is_72_hours() -> None:
    at = datetime(2026, 2, 28, 23, 59, 59, 999999)
    assert receipts.expires_at(at) - at == timedelta(hours=72)
    assert receipts.expires_at(at) == datetime(2026, 3, 3, 23, 59, 59, 999999)


def test_replay_needs_same_digest_and_same_queue() -> None:
    sha = receipts.request_sha256(b"{}")
    assert sha == hashlib.sha256(b"{}").hexdigest()
    q = "ab" * 16
    assert receipts.replay_decision(
        stored_sha256=sha, stored_queue_hex=q, request_sha=sha, queue_hex=q
    )
    other = receipts.request_sha256(b"{ }")
    assert not receipts.replay_decision(
        stored_sha256=sha, stored_queue_hex=q, request_sha=other, queue_hex=q
    )
    assert not receipts.replay_decision(
        stored_sha256=sha, stored_queue_hex=q, request_sha=sha, queue_hex="cd" * 16
    )


def test_problem_body_is_the_error_envelope() -> None:
    exc = receipts.conflict()
    assert json.loads(exc.body()) == {"error": "idempotency_conflict", "message": exc.message}
    assert exc.status == 409


# --- CLI ----------------------------------------------------------------------------------------


def test_api_serve_cli_help_and_bad_port() -> None:
    from click.testing import CliRunner

    from orbit_tasks.cli.main import cli

    runner = CliRunner()
    result = runner.invoke(cli, ["api", "serve", "--help"])
    assert result.exit_code == 0
    assert "--host" in result.output and "127.0.0.1" in result.output
    assert "--log-level" in result.output
    bad = runner.invoke(cli, ["api", "serve", "--port", "70000"])
    assert bad.exit_code == 2
    assert "70000" in bad.output and "allowed 1..65535" in bad.output


@pytest.mark.parametrize(
    "value",
    [
        "application/json",
        "APPLICATION/JSON",
        "application/json; charset=utf-8",
        'application/json;charset="UTF-8"',
        "application/json; boundary=x",
    ],
)
def test_json_content_types(value: str) -> None:
    receipts.check_content_type(value)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "missing or unreadable"),
        ("", "missing or unreadable"),
        ("text/plain", "'text/plain'"),
        ("application/json-seq", "'application/json-seq'"),
        ("application/json; charset=latin-1", "'latin-1'"),
        ("text/plain\x00<script>", "missing or unreadable"),
    ],
)
def test_other_content_types_are_415_naming_the_value(value: str | None, shown: str) -> None:
    exc = problem(receipts.check_content_type, value)
    assert (exc.status, exc.code) == (415, "unsupported_media_type")
    assert shown in exc.message and "application/json" in exc.message


def test_every_503_says_when_to_retry() -> None:
    exc = receipts.unavailable()
    assert (exc.status, exc.code) == (503, "unavailable")
    assert int(exc.headers["Retry-After"]) >= 1
    assert receipts.unauthenticated().headers == {"WWW-Authenticate": "Bearer"}
