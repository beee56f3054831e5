"""enqueue() input validation (pure part): request freezing, exact numbers, refusals with clear
messages. Database behaviour is in tests/integration/test_sender_enqueue.py."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from orbit_tasks.errors import ConflictError, InvalidInput
from orbit_tasks.sender import InvalidRequest, OutboxConflict, enqueue, freeze_request
from orbit_tasks.sender import outbox as freeze
from orbit_tasks.sender.outbox import check_source_ref


def test_errors_are_in_the_project_tree() -> None:
    assert issubclass(InvalidRequest, InvalidInput)
    assert issubclass(OutboxConflict, ConflictError)
    assert InvalidRequest.exit_code == 2 and OutboxConflict.exit_code == 3


def test_text_is_kept_exactly_as_given() -> None:
    text = '{ "b" : 1.10 ,"a":1e400, "big": 123456789012345678901234567890, "s":"😀\\u00e9"}'
    assert freeze_request(text) == text


def test_dict_is_serialized_exactly_without_float() -> None:
    out = freeze_request(
        {
            "z": Decimal("0.1000000000000000000001"),
            "a": [1, Decimal("-0"), Decimal("1E+2"), "é😀", None, True, False],
            "nested": {"k": 123456789012345678901234567890},
        }
    )
    assert out == (
        '{"a":[1,-0,1E+2,"é😀",null,true,false],'
        '"nested":{"k":123456789012345678901234567890},"z":0.1000000000000000000001}'
    )
    parsed = json.loads(out, parse_float=Decimal)
    assert parsed["z"] == Decimal("0.1000000000000000000001")


def test_dict_key_order_does_not_change_the_text() -> None:
    assert freeze_request({"a": 1, "b": 2}) == freeze_request({"b": 2, "a": 1})


def test_float_is_refused_with_a_hint() -> None:
    with pytest.raises(InvalidRequest, match=r"\$\.x.*float.*Decimal"):
        freeze_request({"x": 0.1})
    with pytest.raises(InvalidRequest, match=r"float"):
        freeze_request({"x": [1, 2.5]})


@pytest.mark.parametrize(
    ("request_", "pattern"),
    [
        ("[1,2]", "must be a JSON object, not an array"),
        ('"text"', "not a string"),
        ("42", "not a number"),
        ("null", "not null"),
        ("{", "not valid JSON"),
        ("", "not valid JSON"),
        ('{"a":NaN}', "not valid JSON"),
        ('{"a":1,"a":2}', "key 'a' twice"),
        ({"x": Decimal("NaN")}, "finite"),
        ({"x": Decimal("Infinity")}, "finite"),
        ({1: "x"}, "not a string"),
        ({"x": {1, 2}}, "type set"),
        ({"x": b"raw"}, "type bytes"),
        (["not", "dict"], "type list"),
        (None, "type NoneType"),
        ('{"s":"\ud800"}', "lone surrogate"),
    ],
)
def test_refusals(request_: object, pattern: str) -> None:
    with pytest.raises(InvalidRequest, match=pattern):
        freeze_request(request_)  # type: ignore[arg-type]


def test_size_limit_is_one_mib_of_utf8_bytes() -> None:
    base = '{"p":""}'
    exact = '{"p":"' + "x" * (1024 * 1024 - len(base)) + '"}'
    assert len(exact.encode()) == 1024 * 1024
    assert freeze_request(exact) == exact
    over = '{"p":"' + "x" * (1024 * 1024 - len(base) - 3) + '😀"}'  # 4-byte character
    assert len(over) == 1024 * 1024 - 2 and len(over.encode()) == 1024 * 1024 + 1
    with pytest.raises(InvalidRequest, match=r"1048577 bytes; the limit is 1048576"):
        freeze_request(over)


@pytest.mark.parametrize(
    "key", ["authorization", "Password", "SECRET", "token", "api_key", "Api-Key"]
)
def test_credential_like_top_level_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidRequest, match="credential-like top-level key"):
        freeze_request({key: "x"})
    with pytest.raises(InvalidRequest, match="credential-like"):
        freeze_request(json.dumps({key: "x"}))


def test_nested_and_similar_keys_are_allowed() -> None:
    assert freeze_request({"data": {"token": "t"}, "token_count": 3, "secretary": "x"})


@pytest.mark.parametrize(
    ("ref", "pattern"),
    [
        ("", "0 characters; allowed 1..512"),
        ("x" * 513, "513 characters; allowed 1..512"),
        ("https://user:pass@example.com/doc/1", "embeds credentials"),
        ("s3://AKIA:secret@bucket/key", "embeds credentials"),
        ("https://token@example.com/x", "embeds credentials"),
        ("orders/1\n", "control characters"),
        ("orders/\ud800", "lone surrogate"),
        (42, "type int"),
    ],
)
def test_source_ref_refusals(ref: object, pattern: str) -> None:
    with pytest.raises(InvalidRequest, match=pattern):
        check_source_ref(ref)


@pytest.mark.parametrize(
    "ref",
    [
        "//user:pass@example.com/doc/1",  # scheme-relative URL
        "see <//u:p@host/x>",
        "https://example.com/doc/1?token=abc",
        "https://example.com/doc/1?x=1&Password=abc",
        "https://example.com/doc/1#access_token=abc",
        "https://example.com/doc/1?API-KEY=abc",
    ],
)
def test_source_ref_with_credentials_elsewhere_in_the_url_is_refused(ref: str) -> None:
    with pytest.raises(InvalidRequest, match="embeds credentials"):
        check_source_ref(ref)


def test_dict_with_mixed_key_types_is_a_clear_refusal() -> None:
    with pytest.raises(InvalidRequest, match="not a string"):
        freeze_request({1: "x", "b": 2})  # type: ignore[dict-item]


def test_source_ref_accepted_forms() -> None:
    assert check_source_ref("x" * 512) == "x" * 512
    assert check_source_ref("😀" * 512) == "😀" * 512
    assert check_source_ref("https://example.com/orders/1?at=a@b") == (
        "https://example.com/orders/1?at=a@b"
    )
    assert check_source_ref("orders/42") == "orders/42"
    assert check_source_ref("https://example.com/orders?token_id=5&passwords_page=2") == (
        "https://example.com/orders?token_id=5&passwords_page=2"
    )
    assert check_source_ref("orders/42 by ops@example.com") == "orders/42 by ops@example.com"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("namespace_id", "A" * 32),
        ("queue_id", "a" * 31),
        ("operation_id", "g" * 32),
        ("operation_id", None),
    ],
)
def test_ids_must_be_32_lowercase_hex_before_any_database_work(field: str, value: object) -> None:
    args: dict[str, object] = dict(
        namespace_id="a" * 32,
        queue_id="b" * 32,
        operation_id="c" * 32,
        request={"x": 1},
        source_ref="r",
    )
    args[field] = value
    # conn is never touched: validation fails first (an object() would break any SQL call).
    with pytest.raises(InvalidRequest, match=f"{field} .* 32 lowercase hexadecimal"):
        enqueue(object(), **args)  # type: ignore[arg-type]


def test_wrong_connection_type_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="Connection or Session"):
        enqueue(
            object(),  # type: ignore[arg-type]
            namespace_id="a" * 32,
            queue_id="b" * 32,
            operation_id="c" * 32,
            request={"x": 1},
            source_ref="r",
        )


def _nested(depth: int) -> str:
    """A JSON object whose deepest container is ``depth`` levels down (the object counts)."""
    return '{"a":' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"


def test_nesting_up_to_the_portable_limit_is_kept() -> None:
    text = _nested(freeze.MAX_DEPTH)
    assert freeze_request(text) == text


@pytest.mark.parametrize("depth", [32, 100, 100_000])
def test_deeper_nesting_is_refused_with_the_limit(depth: int) -> None:
    """MariaDB's JSON_VALID (ck_sender_document) refuses more than 31 levels; Python's parser
    recurses (RecursionError) long before 1 MiB of brackets. Both are a clear InvalidRequest."""
    with pytest.raises(InvalidRequest, match="nested .* the limit is 31"):
        freeze_request(_nested(depth))


@pytest.mark.parametrize(
    "text", ['{"a":"\\ud800"}', '{"a":"x\\udc00\\ud83d"}', '{"\\udfff":1}', '{"a":["\\ud800"]}']
)
def test_escaped_lone_surrogates_are_refused(text: str) -> None:
    """Valid for Python's parser, not valid JSON text for MariaDB's JSON_VALID nor UTF-8."""
    with pytest.raises(InvalidRequest, match="lone surrogate"):
        freeze_request(text)


def test_escaped_surrogate_pairs_are_kept() -> None:
    text = '{"a":"\\ud83d\\ude00"}'
    assert freeze_request(text) == text


# --- one rule for the outbox and the platform API (issue 7 item 8) ------------------------------

ONE_RULE_CASES = [
    ('{"a":1}', True),
    (_nested(31), True),
    (_nested(32), False),
    (_nested(999), False),
    ('{"a":"\\ud800"}', False),
    ('{"\\udfff":1}', False),
    ('{"a":"\\ud83d\\ude00"}', True),
    ('{"n":' + "9" * 5000 + "}", True),  # beyond Python's int digit limit: exact, not an error
    ('{"a":1e400}', True),
    ('{"a":NaN}', False),
    ('{"a":1,"a":1}', False),
    ("[1]", False),
    ("", False),
    ('{"p":"' + "x" * (1024 * 1024 - 8) + '"}', True),
    ('{"p":"' + "x" * (1024 * 1024 - 7) + '"}', False),
]


@pytest.mark.parametrize(("text", "valid"), ONE_RULE_CASES, ids=lambda v: str(v)[:24])
def test_outbox_and_api_apply_one_rule(text: str, valid: bool) -> None:
    """enqueue() freezes exactly the bodies the platform API accepts (no request the outbox
    keeps can be refused by the platform as bad JSON, and the reverse)."""
    from orbit_tasks.api import receipts

    try:
        freeze_request(text)
        outbox_ok = True
    except InvalidRequest:
        outbox_ok = False
    try:
        receipts.validate_body(text.encode("utf-8"))
        api_ok = True
    except receipts.ApiProblem:
        api_ok = False
    assert (outbox_ok, api_ok) == (valid, valid)
