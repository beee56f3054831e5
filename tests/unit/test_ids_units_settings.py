"""Pure foundation pieces: UUIDv7 ids and hex, size/duration parsing, settings validation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orbit_tasks.archive_limits import max_slice_seconds, task_time_limits
from orbit_tasks.errors import InvalidInput
from orbit_tasks.ids import from_hex, is_hex_id, new_id, random_id, to_hex, uuid7_bytes
from orbit_tasks.settings import load_settings
from orbit_tasks.units import format_duration, format_size, parse_duration, parse_size

# --- ids -----------------------------------------------------------------------------------------


def test_uuid7_layout_version_variant_and_time() -> None:
    ms = 1_767_225_600_123  # 2026-01-01T00:00:00.123Z
    value = uuid7_bytes(ms)
    assert len(value) == 16
    assert int.from_bytes(value[:6], "big") == ms
    assert value[6] >> 4 == 7  # version 7
    assert value[8] >> 6 == 0b10  # RFC 4122/9562 variant
    assert uuid7_bytes(ms) != value  # random tail
    before = int(time.time() * 1000)
    fresh = new_id()
    after = int(time.time() * 1000)
    assert before <= int.from_bytes(fresh[:6], "big") <= after
    assert uuid7_bytes(0)[:6] == b"\0" * 6
    assert uuid7_bytes(2**48 - 1)[:6] == b"\xff" * 6


@pytest.mark.parametrize("ms", [-1, 2**48])
def test_uuid7_rejects_out_of_range_time(ms: int) -> None:
    with pytest.raises(InvalidInput, match="out of range"):
        uuid7_bytes(ms)


def test_uuid7_sorts_by_time() -> None:
    stamps = [1_000, 1_001, 5_000_000, 2**40, 2**47 + 3]
    ids = [uuid7_bytes(ms) for ms in reversed(stamps)]
    assert [int.from_bytes(i[:6], "big") for i in sorted(ids)] == stamps
    assert sorted(ids) == sorted(ids, key=lambda i: i.hex())  # hex order == byte order


def test_hex_round_trip_and_errors() -> None:
    value = new_id()
    text = to_hex(value)
    assert len(text) == 32 and text == text.lower() and from_hex(text) == value
    assert from_hex(text.upper()) == value
    assert is_hex_id(text) and not is_hex_id(text[:-1]) and not is_hex_id("g" * 32)
    assert len(random_id()) == 16 and random_id() != random_id()
    for bad in ("", "abc", "z" * 32, text + "0", " " + text[1:], "0x" + text[2:]):
        with pytest.raises(InvalidInput, match="32 hexadecimal"):
            from_hex(bad, "job id")
    with pytest.raises(InvalidInput, match="job id 'abc'"):
        from_hex("abc", "job id")
    with pytest.raises(InvalidInput, match="16 bytes, got 15"):
        to_hex(b"x" * 15)


# --- units ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256MiB", 256 * 1024**2),
        ("1GiB", 1024**3),
        ("17B", 17),
        ("3MiB", 3 * 1024**2),
        (42, 42),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


# issue 27: a unit always (a bare number was bytes), no spaces, ASCII digits
@pytest.mark.parametrize(
    "text",
    ["", "MiB", "1.5MiB", "-1MiB", "1MB", "1 mib", "1TiB", "ten", "1 KiB", "1048576", " 3 MiB ",
     "１MiB"],
)  # fmt: skip
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_size(text, "--max-bytes")
    assert f"--max-bytes {text!r}" in str(info.value) and "KiB, MiB or GiB" in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30d", 2592000), ("1h", 3600), ("59m", 3540), ("90s", 90), ("7200s", 7200), (5, 5)],
)
def test_parse_duration(text: str | int, expected: int) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "1.5h", "-1h", "1w", "h", "1 hour", "1H", "7200", " 1h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_duration(text, "--interval")
    assert f"--interval {text!r}" in str(info.value) and "s, m, h or d" in str(info.value)


def test_format_round_trips() -> None:
    for n in (1, 1023, 1024, 1048576, 3 * 1024**3, 1048577):
        assert parse_size(format_size(n)) == n
    assert format_size(256 * 1024**2) == "256MiB" and format_size(1500) == "1500B"
    for s in (1, 59, 60, 3600, 86400, 2592000, 3599, 90061):
        assert parse_duration(format_duration(s)) == s
    assert format_duration(3600) == "1h" and format_duration(3540) == "59m"


# --- settings ------------------------------------------------------------------------------------


def test_settings_defaults_are_embedded(tmp_path: Path) -> None:
    s = load_settings({"ORBIT_VAR_DIR": str(tmp_path)})
    assert s.var_dir == tmp_path.resolve()
    assert s.database_url == f"sqlite:///{tmp_path.resolve() / 'platform.sqlite3'}"
    assert s.sender_database_url == f"sqlite:///{tmp_path.resolve() / 'business.sqlite3'}"
    assert s.broker_url == "filesystem://" and s.broker_is_filesystem
    assert (s.archive_lease_seconds, s.archive_slice_seconds, s.archive_max_stalls) == (120, 20, 20)
    assert (s.sender_lease_seconds, s.tick_seconds, s.sender_tick_seconds) == (60, 60, 2)
    assert s.api_url == "http://127.0.0.1:8080" and s.api_token is None
    assert s.sender_http_timeout_seconds == 10.0  # min(10 s, the largest the lease allows)


def test_settings_read_the_environment() -> None:
    s = load_settings(
        {
            "ORBIT_DATABASE_URL": "mysql+mysqldb://root@127.0.0.1/p",
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
            "ORBIT_API_URL": "http://api:8080/",
            "ORBIT_ARCHIVE_LEASE_SECONDS": "300",
            "ORBIT_ARCHIVE_SLICE_SECONDS": "270",  # the longest (soft limit 280 - margin 10)
            "ORBIT_ACTOR": "alice",
            "ORBIT_TICK_SECONDS": "",  # empty = default
        }
    )
    assert s.database_url.endswith("/p") and not s.broker_is_filesystem
    assert s.api_url == "http://api:8080"
    assert (s.archive_lease_seconds, s.archive_slice_seconds) == (300, 270)
    assert s.actor == "alice" and s.tick_seconds == 60
    assert s.with_overrides(tick_seconds=5).tick_seconds == 5


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("ORBIT_ARCHIVE_LEASE_SECONDS", "3", "..86400)"),
        ("ORBIT_ARCHIVE_LEASE_SECONDS", "86401", "..86400)"),
        ("ORBIT_ARCHIVE_LEASE_SECONDS", "2.5", "not an integer"),  # "2m" is 120 s (issue 27)
        ("ORBIT_ARCHIVE_MAX_STALLS", "0", "1..10000"),
        ("ORBIT_SENDER_LEASE_SECONDS", "4", "5..3600"),
        ("ORBIT_TICK_SECONDS", "3601", "1..3600"),
        ("ORBIT_SENDER_TICK_SECONDS", "0", "1..3600"),
        ("ORBIT_SENDER_HTTP_TIMEOUT_SECONDS", "12", "0.1..11.25 for ORBIT_SENDER_LEASE_SECONDS=60"),
        ("ORBIT_SENDER_HTTP_TIMEOUT_SECONDS", "fast", "not a number"),
    ],
)
def test_settings_out_of_range_names_variable_and_range(name: str, value: str, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        load_settings({name: value})
    message = str(info.value)
    assert name in message and needle in message and "allowed" in message
    assert value in message


@pytest.mark.parametrize(
    ("lease", "slice_s", "top"),
    [
        ("120", "120", 90),
        ("120", "101", 90),  # issue 16 item 8: below the lease, past the soft limit
        ("120", "91", 90),
        ("30", "16", 15),
        ("4", "2", 1),  # the soft limit is 2 s: a 2 s slice died on it
        ("4", "3", 1),
        ("6", "4", 3),
        (None, "120", 90),
    ],
)
def test_settings_refuse_a_slice_that_cannot_end_before_the_soft_limit(
    lease: str | None, slice_s: str, top: int
) -> None:
    env = {"ORBIT_ARCHIVE_SLICE_SECONDS": slice_s}
    if lease is not None:
        env["ORBIT_ARCHIVE_LEASE_SECONDS"] = lease
    with pytest.raises(InvalidInput) as info:
        load_settings(env)
    message = str(info.value)
    assert "ORBIT_ARCHIVE_SLICE_SECONDS" in message and "ORBIT_ARCHIVE_LEASE_SECONDS" in message
    assert f"allowed 1..{top}" in message


@pytest.mark.parametrize("lease", [4, 5, 6, 7, 8, 12, 30, 60, 120, 600, 86400])
def test_the_longest_slice_ends_a_margin_before_the_soft_limit(lease: int) -> None:
    hard, soft = task_time_limits(lease)
    top = max_slice_seconds(lease)
    assert 1 <= top < soft < hard < lease
    assert (
        load_settings(
            {"ORBIT_ARCHIVE_LEASE_SECONDS": str(lease), "ORBIT_ARCHIVE_SLICE_SECONDS": str(top)}
        ).archive_slice_seconds
        == top
    )


@pytest.mark.parametrize(
    ("lease", "default"), [(4, 1), (8, 5), (30, 15), (36, 18), (40, 20), (120, 20)]
)
def test_the_default_slice_fits_the_lease(lease: int, default: int) -> None:
    s = load_settings({"ORBIT_ARCHIVE_LEASE_SECONDS": str(lease)})
    assert s.archive_slice_seconds == default == min(20, max_slice_seconds(lease))


@pytest.mark.parametrize("text", ["７d", "１２h", "1" * 5000 + "d", "1" * 5000 + "s"])
def test_a_duration_is_ascii_digits_and_a_huge_one_is_out_of_range_not_a_traceback(
    text: str,
) -> None:
    """``plan --interval`` and ``policy --archive-after`` parse like the retention: fullwidth
    digits are not a duration; thousands of digits give a value beyond every range (the caller
    says "out of range"), never Python's 4,300-digit ValueError."""
    from orbit_tasks.units import duration_seconds

    if text[0] in "７１":
        with pytest.raises(InvalidInput, match="is not a duration"):
            parse_duration(text)
        assert duration_seconds(text) is None
    else:
        assert parse_duration(text) > 3650 * 86400


def test_a_retention_needs_its_unit() -> None:
    from orbit_tasks.units import duration_seconds

    assert duration_seconds("7", unit_required=True) is None
    assert duration_seconds("7") is None  # issue 27: a unit always, by default
    assert duration_seconds("7", unit_required=False) == 7
    assert duration_seconds(" 7d ", unit_required=True) is None  # no spaces (issue 27)
    assert duration_seconds("007s", unit_required=True) == 7
