"""One helper per idea (issue 26 item 4): the timestamp, the URL redactor and the backoff, each
written once -- and each giving what every former copy gave (the former copies are spelled
here, as the references)."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from orbit_tasks import logs, timestamps
from orbit_tasks.archive.engine import objects
from orbit_tasks.archive.format.values import FormatError, encode_value, parse_ts
from orbit_tasks.backoff import exponential_cap, full_jitter
from orbit_tasks.redaction import redact_url, redact_urls
from orbit_tasks.sender import policy

# --- the timestamp ---------------------------------------------------------------------------

_MOMENTS = [
    datetime(2026, 1, 2, 3, 4, 5, 123456),
    datetime(2026, 12, 31, 23, 59, 59, 999999),
    datetime(2000, 2, 29, 0, 0, 0, 0),  # no fraction: still six digits
    datetime(1970, 1, 1),
    datetime(1000, 1, 1, 0, 0, 0, 1),
    datetime(9999, 12, 31, 23, 59, 59, 999999),
]


@pytest.mark.parametrize("moment", _MOMENTS)
def test_the_timestamp_is_every_former_spelling(moment: datetime) -> None:
    text = timestamps.format_ts(moment)
    assert text == moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # cli, api, archive jobs, tick
    assert text == moment.isoformat(timespec="microseconds") + "Z"  # sender review, retention
    assert text == encode_value(moment)  # the archive format's value encoding
    assert timestamps.parse_ts(text) == moment == parse_ts(text)
    assert timestamps.format_optional(moment) == text and timestamps.format_optional(None) is None


def test_aware_times_are_converted_and_log_times_are_the_same_spelling() -> None:
    east = timezone(timedelta(hours=2))
    assert timestamps.format_ts(datetime(2026, 1, 2, 5, 4, 5, 7, tzinfo=east)) == (
        "2026-01-02T03:04:05.000007Z"
    )
    rng = random.Random(26)
    for _ in range(200):
        created = rng.uniform(0, 4_000_000_000)
        former = datetime.fromtimestamp(created, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert timestamps.format_epoch(created) == former == logs.utc_ts(created)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2026-01-02T03:04:05.123456", "is not YYYY"),  # no Z
        ("2026-01-02 03:04:05.123456Z", "is not YYYY"),
        ("2026-01-02T03:04:05Z", "is not YYYY"),  # no fraction
        ("2026-02-30T03:04:05.123456Z", "not a valid date"),
        ("２026-01-02T03:04:05.123456Z", "is not YYYY"),  # non-ASCII digits
    ],
)
def test_parsing_is_strict_and_the_archive_says_format_error(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        timestamps.parse_ts(text)
    with pytest.raises(FormatError, match=why):
        parse_ts(text)
    with pytest.raises(FormatError, match="is not YYYY"):
        parse_ts(12)  # type: ignore[arg-type]


# --- the URL redactor ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        # the former db.engine cases: a password
        ("mysql://root:pw-123@h:3306/db", "pw-123"),
        ("mysql://user:p@ss-word@host/db", "p@ss-word"),
        ("http://user:s3cret@127.0.0.1:9/", "s3cret"),
        # the former objects cases: any user info, a query, a fragment
        ("http://AKIAORBIT:s3cr3tPassw0rd@minio:9000", "s3cr3tPassw0rd"),
        ("http://s3cr3tPassw0rd@minio:9000", "s3cr3tPassw0rd"),
        ("http://minio:9000/?X-Amz-Signature=s3cr3tPassw0rd", "s3cr3tPassw0rd"),
        ("http://minio:9000?token=s3cr3tPassw0rd", "s3cr3tPassw0rd"),
        ("http://minio:9000#s3cr3tPassw0rd", "s3cr3tPassw0rd"),
        ("s3://AKIAORBIT:s3cr3tPassw0rd@bucket/p", "s3cr3tPassw0rd"),
        # stricter now: what one of the three let through
        ("mysql://orbit-token-user@h/db", "orbit-token-user"),  # db.engine kept a lone user
        ("mysql://u:pa/ss@h/db", "pa/ss"),  # a password with '/' (SQLAlchemy reads it so)
        ("mysql://u:pa?ss@h/db", "pa?ss"),
        ("mysql://u@h/db?ssl_key=/k&password=hunter2", "hunter2"),  # db.engine kept queries
        ("redis://:pw-in-redis@h:6379/0#frag", "pw-in-redis"),
    ],
)
def test_every_former_case_is_redacted_and_the_stricter_ones_too(url: str, secret: str) -> None:
    shown = redact_url(url)
    assert secret not in shown and "***" in shown
    line = logs.redact(f"connecting to {url} failed")
    assert secret not in line and logs.REDACTED in line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mysql://root:pw@h:3306/db", "mysql://***@h:3306/db"),
        ("user:p@ss@host/db", "***@host/db"),  # no scheme (a message's URL, not a log's)
        ("http://minio:9000/?X-Amz-Signature=s", "http://minio:9000/?***"),
        ("http://h:1/p#f?q", "http://h:1/p#***"),
        ("s3://bucket/a/b", "s3://bucket/a/b"),  # nothing secret: unchanged
        ("sqlite:///var/x.sqlite3", "sqlite:///var/x.sqlite3"),
        ("127.0.0.1:8000", "127.0.0.1:8000"),
        ("", ""),
    ],
)
def test_what_stays_visible(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_urls_inside_a_text_keep_the_words_around_them() -> None:
    text = "broker redis://:pw@10.0.0.1:6379/0 and 'mysql://u:x@db/o', then http://h/ok."
    assert redact_urls(text, "<r>") == (
        "broker redis://<r>@10.0.0.1:6379/0 and 'mysql://<r>@db/o', then http://h/ok."
    )
    assert logs.redact("Connected to redis://127.0.0.1:6379/0") == (
        "Connected to redis://127.0.0.1:6379/0"
    )


def test_the_s3_messages_use_the_one_redactor() -> None:
    from orbit_tasks.archive.s3_locations import S3Location, check_options, parse_s3_url
    from orbit_tasks.errors import InvalidInput

    with pytest.raises(InvalidInput) as caught:
        parse_s3_url("s3://KEY:s3cr3t@bucket/p")
    assert "s3cr3t" not in str(caught.value) and "s3://***@bucket/p" in str(caught.value)
    with pytest.raises(InvalidInput) as caught:
        check_options(S3Location("bucket", endpoint="http://h:9000/?sig=s3cr3t"))
    assert "s3cr3t" not in str(caught.value) and "http://h:9000/?***" in str(caught.value)


# --- the backoff -----------------------------------------------------------------------------


def _former_objects_backoff(attempt: int, rnd: float) -> float:
    return rnd * min(2.0, 0.05 * (2 ** min(attempt, 30)))


def _former_sender_cap(send_count: int) -> float:
    n = max(1, send_count)
    if n > 30:
        return 300.0
    return min(300.0, 1.0 * 2 ** (n - 1))


def test_both_callers_get_the_values_they_had() -> None:
    rng = random.Random(4)
    for attempt in range(0, 45):
        rnd = rng.random()
        assert objects.backoff(attempt, rnd=rnd) == _former_objects_backoff(attempt, rnd)
    for send_count in range(-2, 45):
        assert policy.backoff_cap(send_count) == _former_sender_cap(send_count)


def test_the_backoff_is_capped_exponential_with_full_jitter() -> None:
    assert [exponential_cap(n, base=1.0, cap=10.0) for n in range(6)] == [1, 2, 4, 8, 10, 10]
    assert exponential_cap(-3, base=0.5, cap=10.0) == 0.5
    assert exponential_cap(10**9, base=1.0, cap=7.0) == 7.0  # no overflow
    assert full_jitter(3, base=1.0, cap=10.0, rnd=0.25) == 2.0
    assert full_jitter(3, base=1.0, cap=10.0, rnd=0.0) == 0.0


def test_the_timestamp_is_spelled_once() -> None:
    """No module of the package spells the format again (the database's own spellings for
    SQLite's clock and MariaDB's DATE_FORMAT are SQL, not this)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "orbit_tasks"
    spelled = re.compile(r'%Y-%m-%dT%H:%M:%S|isoformat\([^)]*\) \+ "Z"|isoformat\(\)\}Z')
    found = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "migrations" not in p.parts and spelled.search(p.read_text())
    ]
    assert found == []
