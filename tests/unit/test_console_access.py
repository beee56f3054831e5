"""Pure rules of the console's access (issue 29 item 4): the stored hash, the session-bound
CSRF token, the Origin check, names and passwords."""

from __future__ import annotations

import pytest

from orbit_tasks.console import access
from orbit_tasks.console.pages import anchor, e
from orbit_tasks.errors import InvalidInput


def test_a_secret_is_stored_as_scrypt_and_checked_in_constant_time() -> None:
    stored = access.hash_secret("correct horse battery", salt=b"\x01" * 16)
    assert stored.startswith("scrypt$16384$8$1$" + "01" * 16 + "$")
    assert "correct horse battery" not in stored
    assert access.check_secret("correct horse battery", stored)
    assert not access.check_secret("correct horse batterY", stored)
    assert access.hash_secret("correct horse battery") != access.hash_secret(
        "correct horse battery"
    )  # a fresh salt each time
    for broken in ("", "plain", "md5$1$2$3$00$00", stored.replace("$8$", "$x$")):
        assert not access.check_secret("correct horse battery", broken)


def test_the_csrf_token_belongs_to_its_session() -> None:
    one, two = access.new_session_id(), access.new_session_id()
    assert one != two and len(one) >= 43
    assert access.csrf_ok(one, access.csrf_token(one))
    assert not access.csrf_ok(two, access.csrf_token(one))
    assert not access.csrf_ok(one, None) and not access.csrf_ok(one, "")
    assert access.session_digest(one) != one and len(access.session_digest(one)) == 64


def test_origin_must_be_this_server_when_the_browser_sends_one() -> None:
    host = "127.0.0.1:8090"
    assert access.origin_ok(None, host)
    assert access.origin_ok("http://127.0.0.1:8090", host)
    assert not access.origin_ok("http://127.0.0.1:9999", host)  # same site, another origin
    assert not access.origin_ok("http://evil.test", host)
    assert not access.origin_ok("null", host)


def test_only_an_operator_may_act() -> None:
    assert access.may_act(access.Role.OPERATOR)
    assert not access.may_act(access.Role.VIEWER)


@pytest.mark.parametrize("name", ["", "Bob", "a b", "x" * 65, "-lead", "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="1..64 characters"):
        access.validate_user_name(name)


@pytest.mark.parametrize(
    ("secret", "why"),
    [
        ("short", "allowed 12..1024"),
        ("x" * 1025, "allowed 12..1024"),
        ("tab\there-long", "control"),
    ],
)
def test_bad_passwords_are_refused(secret: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        access.validate_secret(secret)


def test_pages_escape_every_value_and_link_runbook_anchors() -> None:
    assert e("<script>\"'") == "&lt;script&gt;&quot;&#x27;"
    assert e(None) == "-"
    assert anchor("OrbitStorageUnserved") == "orbitstorageunserved"
    assert anchor("A catch-up (`archive.job.range_cut`, `archive.plan.catch_up`)") == (
        "a-catch-up-archivejobrange_cut-archiveplancatch_up"
    )
