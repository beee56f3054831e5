"""The one rule for a task submission body (SPEC §8), applied by ``enqueue()`` and the reference
API alike, so that a request the outbox freezes is one the platform accepts and the reverse.

A body is at most 1 MiB of UTF-8, parses as JSON with every number exact (``Decimal``; no
``NaN``/``Infinity``, no duplicate keys in one object), is a JSON object, and is storable in a
``JSON_VALID`` column (``ck_sender_document``): at most :data:`MAX_DEPTH` nested
objects/arrays and no lone surrogate (an escaped ``"\\ud800"`` parses in Python but is neither
UTF-8 nor valid JSON text for MariaDB). Pure: no I/O. Messages never carry body content (the
API answers with them).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Literal

MAX_DOCUMENT_BYTES = 1024 * 1024  # the platform's limit (413 above it)
# MariaDB's JSON_VALID (ck_sender_document, ck_sender_receipt) refuses deeper documents.
MAX_DEPTH = 31

Problem = Literal[
    "too_large", "not_utf8", "surrogate", "invalid_json", "duplicate_key", "not_object", "too_deep"
]


class DocumentProblem(ValueError):
    """Why a body breaks the rule: a stable ``code`` and a message without body content.
    ``key`` is the duplicated key of a ``duplicate_key`` problem (for local callers only)."""

    def __init__(self, code: Problem, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.key = key


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__("duplicate object key")
        self.key = key


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def parse_exact(text: str) -> Any:
    """JSON with exact numbers (``Decimal`` for every number, so a 5,000-digit integer is no
    error either); refuses ``NaN``/``Infinity`` and duplicate keys. Raises ``ValueError``
    (``json.JSONDecodeError`` included) or ``RecursionError``."""
    return json.loads(
        text,
        parse_float=Decimal,
        parse_int=Decimal,
        parse_constant=_no_constant,
        object_pairs_hook=_object_without_duplicates,
    )


def storage_problem(doc: Any) -> Literal["too_deep", "surrogate"] | None:
    """What the parser accepts but a ``JSON_VALID`` CHECK refuses: nesting deeper than
    :data:`MAX_DEPTH` objects/arrays, or a string (key or value) with a lone surrogate."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return "too_deep"
            items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
            for key, item in items:
                if key is not None:
                    stack.append((key, depth))
                stack.append((item, depth + 1))
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "surrogate"
    return None


def json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def too_deep_message(subject: str) -> str:
    return f"{subject} is nested too deeply; the limit is {MAX_DEPTH} levels of objects/arrays"


def surrogate_message(subject: str) -> str:
    return (
        f"{subject} has a string with a lone surrogate (an unpaired \\ud800-\\udfff); it is "
        "neither valid UTF-8 nor storable JSON"
    )


def check_document(data: bytes | str, *, subject: str = "request body") -> tuple[str, Any]:
    """Apply the rule to the raw bytes (API) or text (``enqueue``); return the text exactly as
    given (bytes decoded as UTF-8, never re-serialized) and the parsed object."""
    if isinstance(data, bytes):
        size = len(data)
        if size > MAX_DOCUMENT_BYTES:
            raise _too_large(subject, size)
        try:
            text = data.decode("utf-8", errors="strict")
        except UnicodeDecodeError as exc:
            raise DocumentProblem(
                "not_utf8", f"{subject} is not valid UTF-8 (byte offset {exc.start})"
            ) from None
    else:
        text = data
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise DocumentProblem("surrogate", surrogate_message(subject)) from None
        if size > MAX_DOCUMENT_BYTES:
            raise _too_large(subject, size)
    try:
        doc = parse_exact(text)
    except _DuplicateKey as exc:
        raise DocumentProblem(
            "duplicate_key", f"{subject} has a duplicate key in one object", key=exc.key
        ) from None
    except json.JSONDecodeError as exc:
        raise DocumentProblem(
            "invalid_json", f"{subject} is not valid JSON ({exc.msg} at char {exc.pos})"
        ) from None
    except RecursionError:
        raise DocumentProblem("too_deep", too_deep_message(subject)) from None
    except ValueError as exc:  # our own hooks (NaN/Infinity); their text holds no body content
        raise DocumentProblem("invalid_json", f"{subject} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise DocumentProblem(
            "not_object", f"{subject} must be a JSON object, not {json_type(doc)}"
        )
    problem = storage_problem(doc)
    if problem == "too_deep":
        raise DocumentProblem("too_deep", too_deep_message(subject))
    if problem == "surrogate":
        raise DocumentProblem("surrogate", surrogate_message(subject))
    return text, doc


def _too_large(subject: str, size: int) -> DocumentProblem:
    return DocumentProblem(
        "too_large",
        f"{subject} is {size} bytes; the limit is {MAX_DOCUMENT_BYTES} bytes (1 MiB)",
    )
