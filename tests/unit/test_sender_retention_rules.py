"""Pure rules of retention and resolutions (orbit_tasks/sender/policy.py) and the
``ORBIT_SENDER_RETENTION`` setting, at their boundaries."""

from __future__ import annotations

import datetime as dt

import pytest

from orbit_tasks.errors import InvalidInput
from orbit_tasks.sender import policy
from orbit_tasks.sender_limits import MAX_RETENTION_SECONDS
from orbit_tasks.settings import load_settings

T = dt.datetime(2026, 12, 1, 12, 0, 0, 500000)
US = dt.timedelta(microseconds=1)


def test_accepted_rows_are_prunable_strictly_before_the_cutoff() -> None:
    assert policy.prunable("ACCEPTED", T - US, None, T)
    assert not policy.prunable("ACCEPTED", T, None, T)
    assert not policy.prunable("ACCEPTED", T + US, None, T)


@pytest.mark.parametrize("state", ["PENDING", "SENDING"])
def test_open_rows_are_never_prunable(state: str) -> None:
    old = T - dt.timedelta(days=3650)
    assert not policy.prunable(state, old, old, T)


def test_review_rows_only_when_resolved_before_the_cutoff() -> None:
    old = T - dt.timedelta(days=30)
    assert not policy.prunable("REVIEW", old, None, T)  # unresolved: never
    assert policy.prunable("REVIEW", old, T - US, T)
    assert not policy.prunable("REVIEW", old, T, T)


def test_a_resolution_holds_only_for_the_review_it_was_recorded_on() -> None:
    assert policy.resolution_current("REVIEW", T, T)
    assert not policy.resolution_current("REVIEW", T + US, T)  # requeued and back since
    assert not policy.resolution_current("PENDING", T, T)  # requeued
    assert not policy.resolution_current("REVIEW", T, None)


@pytest.mark.parametrize(
    ("reason", "refused"),
    [
        ("granted the queue", ""),
        ("x" * 500, ""),
        ("é😀 ok", ""),
        ("", "allowed 1..500"),
        ("   ", "not blank"),
        ("x" * 501, "--reason is 501 characters"),
        ("two\nlines", "non-printable character U+000A at position 3"),
        ("tab\there", "non-printable character U+0009"),
        ("\ud800", "non-printable character U+D800"),  # a lone surrogate
        # issue 23: line separators other than \n passed the one-line rule
        ("next\u0085line", "non-printable character U+0085"),
        ("a\u2028b", "U+2028"),
        ("a\u2029b", "U+2029"),
        ("\u202eevil", "U+202E"),  # a bidi override
        ("a\u00a0b", ""),  # a no-break space is a space
    ],
)
def test_reasons(reason: str, refused: str) -> None:
    got = policy.reason_refusal(reason)
    assert (got == "") if not refused else (refused in got), got


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [(None, None), ("", None), ("off", None), ("OFF", None), ("7d", 604800), ("1s", 1),
     ("36h", 129600), ("3650d", 3650 * 86400)],
)  # fmt: skip
def test_retention_setting(raw: str | None, seconds: int | None) -> None:
    env = {} if raw is None else {"ORBIT_SENDER_RETENTION": raw}
    assert load_settings(env).sender_retention_seconds == seconds


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("0s", "ORBIT_SENDER_RETENTION=0s is out of range (allowed 1s..3650d, or off)"),
        # a bare number is no retention: "7" meant as days would prune rows older than 7 s
        ("7", "ORBIT_SENDER_RETENTION='7' is not a duration"),
        ("\uff17d", "is not a duration"),  # a fullwidth 7: ASCII digits only
        ("9" * 5000 + "d", "is out of range"),  # no int() of 5000 digits (ValueError)
        ("3651d", "ORBIT_SENDER_RETENTION=3651d is out of range (allowed 1s..3650d, or off)"),
        ("7 days", "ORBIT_SENDER_RETENTION='7 days' is not a duration"),
        ("-1d", "is not a duration"),
        ("on", "is not a duration"),
    ],
)
def test_bad_retention_settings_name_the_value_and_the_range(raw: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings({"ORBIT_SENDER_RETENTION": raw})
    assert message in str(err.value) and "1s..3650d" in str(err.value)


def test_older_than_range() -> None:
    assert policy.retention_refusal(1, "--older-than") == ""
    assert policy.retention_refusal(3650 * 86400, "--older-than") == ""
    assert "allowed 1s..3650d" in policy.retention_refusal(0, "--older-than")
    assert "allowed 1s..3650d" in policy.retention_refusal(3650 * 86400 + 1, "--older-than")


def test_who_resolves_operator_then_actor_then_the_os_user() -> None:
    assert (
        load_settings({"ORBIT_OPERATOR": "op", "ORBIT_ACTOR": "ac", "USER": "u"}).operator == "op"
    )
    assert load_settings({"ORBIT_ACTOR": "ac", "USER": "u"}).operator == "ac"
    assert load_settings({"USER": "u"}).operator == "u"
    assert load_settings({}).operator  # the password database's name for this uid


@pytest.mark.parametrize("name", ["ORBIT_OPERATOR", "ORBIT_ACTOR"])
@pytest.mark.parametrize("value", ["alice\nerror: forged", "bob\u0085", "eve\u2028x"])
def test_an_operator_on_more_than_one_line_is_refused(name: str, value: str) -> None:
    """Issue 23: ORBIT_OPERATOR holding a newline was stored and printed verbatim."""
    with pytest.raises(InvalidInput) as refused:
        load_settings({name: value, "USER": "u"})
    message = str(refused.value)
    assert name in message and "non-printable character U+" in message and "\n" not in message


@pytest.mark.parametrize(
    ("text", "seconds", "why"),
    [
        ("7d", 604800, ""),
        ("36h", 129600, ""),
        # issue 23: a stray space was accepted (and the prune ran)
        ("1s ", 0, "--older-than '1s ' is not a duration"),
        (" 36h", 0, "is not a duration"),
        ("7 d", 0, "is not a duration"),
        ("1s", 1, ""),
        ("3650d", 3650 * 86400, ""),
        ("7", 0, "--older-than '7' is not a duration; use an integer with s, m, h or d, e.g. 7d, "
         "without spaces (allowed 1s..3650d)"),
        ("\u0667d", 0, "is not a duration"),  # an Arabic-Indic 7
        ("7w", 0, "is not a duration"),
        ("-1d", 0, "is not a duration"),
        ("0s", 0, "--older-than 0s is out of range (allowed 1s..3650d)"),
        ("3651d", 3651 * 86400, "--older-than 3651d is out of range (allowed 1s..3650d)"),
        ("9" * 5000 + "d", MAX_RETENTION_SECONDS + 1,
         "--older-than 9999999999999999...(5001 characters) is out of range"),
    ],
)  # fmt: skip
def test_parse_retention(text: str, seconds: int, why: str) -> None:
    got_seconds, got_why = policy.parse_retention(text, "--older-than")
    assert (got_why == "") if not why else (why in got_why), got_why
    if not why or "out of range" in why:
        assert got_seconds == seconds or got_seconds > seconds == MAX_RETENTION_SECONDS + 1
    assert len(got_why) < 120 and "\n" not in got_why
