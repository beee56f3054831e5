"""The one vocabulary of values (issue 27, orbit_tasks/units.py): durations and sizes always
with a unit, ASCII digits only, one rule of reasons, the environment's durations, and the click
types of cli/common.py that carry them. Pure: no database, no process."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from orbit_tasks import units
from orbit_tasks.cli.common import (
    DecimalParam,
    DurationParam,
    IntegerParam,
    OrbitGroup,
    ReasonParam,
    SizeParam,
    WordChoice,
)
from orbit_tasks.errors import InvalidInput
from orbit_tasks.settings import load_settings

FULLWIDTH_10 = "\uff11\uff10"  # "１０"


# --- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"), [("5s", 5), ("15m", 900), ("6h", 21600), ("30d", 2592000), ("007s", 7)]
)
def test_a_duration_is_digits_and_a_unit(text: str, seconds: int) -> None:
    assert units.parse_duration(text, "--interval") == seconds


@pytest.mark.parametrize("text", ["30", "0", "3600"])
def test_a_bare_number_is_not_read_as_seconds(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        units.parse_duration(text, "--archive-after")
    message = str(info.value)
    assert message.startswith(
        f"--archive-after '{text}' is not a duration: the number needs a unit"
    )
    assert "s, m, h or d" in message and "\n" not in message


@pytest.mark.parametrize(
    "text", [" 5s", "5s ", "5 s", "\uff15s", "5S", "1.5h", "-5s", "+5s", "5_0s", "5sec", "٥s"]
)
def test_a_duration_has_no_spaces_no_sign_and_ascii_digits(text: str) -> None:
    with pytest.raises(InvalidInput, match="is not a duration; use an integer with s, m, h or d"):
        units.parse_duration(text, "--interval")


# --- sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"), [("17B", 17), ("4KiB", 4096), ("256MiB", 256 * 1024**2), ("1GiB", 1024**3)]
)
def test_a_size_is_digits_and_a_unit(text: str, size: int) -> None:
    assert units.parse_size(text, "--max-bytes") == size


def test_a_bare_size_is_not_read_as_bytes() -> None:
    with pytest.raises(InvalidInput, match="'1048576' is not a size: the number needs a unit"):
        units.parse_size("1048576", "--max-bytes")
    for text in (" 1MiB", "1 MiB", "\uff11MiB", "1mib", "1MB"):
        with pytest.raises(InvalidInput, match="is not a size; use an integer with B, KiB"):
            units.parse_size(text, "--max-bytes")


# --- integers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [FULLWIDTH_10, " 10", "10 ", "+10", "1_0", "10.0", "١٠", ""])
def test_integers_are_ascii_digits_only(text: str) -> None:
    assert int(text) == 10 if text not in ("10.0", "") else True  # what int() would have read
    assert units.ascii_int(text) is None
    with pytest.raises(InvalidInput) as info:
        units.parse_int(text, "--max-roots-per-second", 1, 10_000_000)
    assert "is not an integer (allowed 1..10,000,000; ASCII digits 0-9 only)" in str(info.value)


def test_integers_in_and_out_of_range() -> None:
    assert units.parse_int("10", "--limit", 1, 1000) == 10
    with pytest.raises(InvalidInput, match=r"--limit 1001 is out of range \(allowed 1..1000\)"):
        units.parse_int("1001", "--limit", 1, 1000)
    # thousands of digits: beyond every range, not Python's 4,300-digit ValueError
    with pytest.raises(InvalidInput, match="out of range"):
        units.parse_int("9" * 5000, "--limit", 1, 1000)


# --- reasons ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("r\nsecond line", "non-printable character U+000A at position 1 (a control character)"),
        ("\t", "non-printable character U+0009 at position 0 (a control character)"),
        ("ok\u202eevil", "U+202E at position 2 (a format character)"),
        ("a\u2028b", "U+2028 at position 1 (a line separator)"),
        ("ab\udcffc", "is not valid UTF-8: the byte 0xFF at position 2"),  # from the shell
        ("", "is blank (allowed 1..255"),
        ("   ", "is blank (allowed 1..255"),
        ("x" * 256, "is 256 characters (allowed 1..255"),
    ],
)
def test_one_reason_rule_names_the_actual_problem(text: str, needle: str) -> None:
    refusal = units.text_refusal(text, "--reason", 255)
    assert refusal.startswith("--reason ") and needle in refusal, refusal
    assert "\n" not in refusal and "characters is invalid" not in refusal


def test_the_archive_and_the_sender_share_the_reason_rule() -> None:
    from orbit_tasks.archive import controls
    from orbit_tasks.error_lines import describe_error
    from orbit_tasks.sender import policy

    for text in ("r\nsecond line", "\t", "ab\udcffc"):
        with pytest.raises(InvalidInput) as archive:
            controls.validate_reason(text)
        worded = describe_error(archive.value)[0]
        assert worded == policy.reason_refusal(text) == units.text_refusal(text, "--reason", 500)
    assert controls.validate_reason("disk swap") == "disk swap"


# --- environment ---------------------------------------------------------------------------------


def test_env_durations_keep_bare_seconds_and_take_the_units() -> None:
    s = load_settings({"ORBIT_TICK_SECONDS": "2m", "ORBIT_SENDER_TICK_SECONDS": "5"})
    assert (s.tick_seconds, s.sender_tick_seconds) == (120, 5)
    s = load_settings({"ORBIT_METRICS_TIMEOUT_SECONDS": "0.5", "ORBIT_METRICS_CACHE_SECONDS": "1m"})
    assert (s.metrics_timeout_seconds, s.metrics_cache_seconds) == (0.5, 60)
    assert load_settings({"ORBIT_METRICS_TIMEOUT_SECONDS": "30s"}).metrics_timeout_seconds == 30


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("ORBIT_TICK_SECONDS", FULLWIDTH_10, "is not a duration"),
        ("ORBIT_TICK_SECONDS", " 10", "is not a duration"),
        ("ORBIT_TICK_SECONDS", "2h", "out of range (allowed 1..3600)"),
        ("ORBIT_SENDER_CONCURRENCY", FULLWIDTH_10, "is not an integer (allowed 1..256"),
        ("ORBIT_SENDER_CONCURRENCY", " 8", "is not an integer"),
        ("ORBIT_METRICS_TIMEOUT_SECONDS", "1e1", "is not a number of seconds"),
        ("ORBIT_METRICS_TIMEOUT_SECONDS", "nan", "is not a number of seconds"),
    ],
)
def test_env_numbers_are_ascii_digits(name: str, value: str, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        load_settings({name: value})
    assert str(info.value).startswith(f"{name}=") and needle in str(info.value)


# --- the click types ----------------------------------------------------------------------------


def _command() -> click.Group:
    @click.group(cls=OrbitGroup)
    def root() -> None:
        pass

    @root.command("c")
    @click.option("--wait-after", type=DurationParam(60, 86400))
    @click.option("--max-bytes", type=SizeParam())
    @click.option("--limit", type=IntegerParam(1, 1000))
    @click.option("--share", type=DecimalParam(0.0, 1.0))
    @click.option("--state", type=WordChoice(["PENDING", "REVIEW"]))
    @click.option("--reason", type=ReasonParam(20))
    def c(**values: object) -> None:
        click.echo(repr(sorted(values.items())))

    return root


def test_the_click_types_parse_through_units() -> None:
    args = ["c", "--wait-after", "1h", "--max-bytes", "2KiB", "--limit", "7", "--share", "0.5"]
    result = CliRunner().invoke(_command(), [*args, "--state", "review", "--reason", "why"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == repr(
        [("limit", 7), ("max_bytes", 2048), ("reason", "why"), ("share", 0.5),
         ("state", "REVIEW"), ("wait_after", 3600)]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--wait-after", "30"], "invalid value for '--wait-after': '30' is not a duration: the"),
        (["--wait-after", "59s"], "'--wait-after': 59s is out of range (allowed 1m..1d)"),
        (["--max-bytes", "7"], "'--max-bytes': '7' is not a size: the number needs a unit"),
        (["--limit", FULLWIDTH_10], f"'--limit': '{FULLWIDTH_10}' is not an integer"),
        (["--share", "1e-1"], "'--share': '1e-1' is not a number (allowed 0..1"),
        (["--state", "lost"], "'--state': 'lost' is not one of 'PENDING', 'REVIEW'"),
        (["--reason", "a\tb"], "'--reason': the text contains the non-printable character U+0009"),
    ],
)
def test_the_click_types_refuse_in_one_line(args: list[str], line: str) -> None:
    result = CliRunner().invoke(_command(), ["c", *args])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and line in lines[0], lines
