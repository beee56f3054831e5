"""Log formats (SPEC §12 "Logs"): one JSON object per line, UTC ``ts`` with ``Z``, the redaction
safety net, and the settings that choose them. Pure: records are formatted in memory."""

from __future__ import annotations

import io
import json
import logging
from decimal import Decimal

import pytest

from orbit_tasks.errors import InvalidInput
from orbit_tasks.logs import (
    JsonFormatter,
    OrbitLogHandler,
    configure_logging,
    log_action,
    redact,
    utc_ts,
)
from orbit_tasks.settings import load_settings

TOKEN = "orb_Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA-_x"


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("celery.worker", logging.WARNING, __file__, 1, msg, args, None)
    for k, v in extra.items():
        setattr(record, k, v)
    record.created = 1767323045.123456  # 2026-01-02T03:04:05.123456Z
    return record


def test_utc_ts_has_microseconds_and_z() -> None:
    assert utc_ts(1767323045.123456) == "2026-01-02T03:04:05.123456Z"


def test_json_line_of_a_foreign_record_has_message() -> None:
    line = JsonFormatter().format(_record("Task %s[%s] received", "orbit.sender.tick", "abc"))
    obj = json.loads(line)
    assert list(obj)[:3] == ["ts", "level", "logger"]
    assert obj["ts"] == "2026-01-02T03:04:05.123456Z"
    assert (obj["level"], obj["logger"]) == ("WARNING", "celery.worker")
    assert obj["message"] == "Task orbit.sender.tick[abc] received"
    assert "action" not in obj and "\n" not in line


def test_action_record_carries_action_then_fields() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("orbit.test.json")
    handler = OrbitLogHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        log_action(
            logger,
            "archive.job.claimed",
            job_id=b"\x01" * 16,
            roots=3,
            amount=Decimal("0.10000000000000000001"),
            ts="a field named like a key",
            note="😀",
        )
    finally:
        logger.removeHandler(handler)
    obj = json.loads(stream.getvalue())
    assert list(obj)[:4] == ["ts", "level", "logger", "action"]
    assert obj["action"] == "archive.job.claimed" and obj["level"] == "INFO"
    assert obj["job_id"] == "01" * 16 and obj["roots"] == 3
    assert obj["amount"] == "0.10000000000000000001"  # exact, never a float
    assert obj["ts_"] == "a field named like a key" and obj["note"] == "😀"


def test_a_disabled_level_builds_nothing() -> None:
    """The hot paths log per file and per row: below the logger's level no field is rendered."""

    class Loud:
        rendered = 0

        def __str__(self) -> str:
            Loud.rendered += 1
            return "loud"

    logger = logging.getLogger("orbit.test.disabled")
    logger.setLevel(logging.WARNING)
    log_action(logger, "archive.job.confirmed", value=Loud())
    assert Loud.rendered == 0
    stream = io.StringIO()
    handler = OrbitLogHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        log_action(logger, "archive.job.failed", logging.WARNING, value=Loud())
    finally:
        logger.removeHandler(handler)
    assert Loud.rendered >= 1 and "archive.job.failed" in stream.getvalue()


def test_exceptions_are_one_line_with_type() -> None:
    try:
        raise RuntimeError(f"boom Authorization: Bearer {TOKEN}")
    except RuntimeError:
        import sys

        record = _record("failed")
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["exc_type"] == "RuntimeError" and "Traceback" in obj["exc"]
    assert TOKEN not in line and "<redacted>" in obj["exc"]


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"sending with {TOKEN}", TOKEN),
        ("headers {'Authorization': 'Bearer abcdefgh12345678'}", "abcdefgh12345678"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
        ("broker redis://:s3cret-pw@10.0.0.1:6379/0", "s3cret-pw"),
        ("db mysql+mysqldb://orbit:orbit-dev-password@db/orbit", "orbit-dev-password"),
        ("GET /cb?access_token=xyz987&x=1", "xyz987"),
        ("password=hunter2222 next", "hunter2222"),
        (
            "(MySQLdb.DataError) (1406, 'too long')\n[SQL: INSERT INTO t VALUES (%s)]\n"
            '[parameters: (\'{"card": "4111]"}\',)]\n(Background on this error at: x)',
            "4111",
        ),
    ],
)
def test_redaction_safety_net(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and "<redacted>" in out


def test_redaction_leaves_ordinary_text_alone() -> None:
    for text in [
        "basic authentication configured",
        "Connected to redis://127.0.0.1:6379/0",
        'archive.job.claimed {"job_id": "0a0b", "attempts": 2}',
        "token bucket refilled",
    ]:
        assert redact(text) == text


def test_configure_logging_replaces_its_own_handler_only() -> None:
    root = logging.getLogger()
    foreign = logging.StreamHandler(io.StringIO())
    root.addHandler(foreign)
    before_level = root.level
    try:
        first = io.StringIO()
        configure_logging("json", "INFO", stream=first)
        second = io.StringIO()
        configure_logging("text", "WARNING", stream=second)
        mine = [h for h in root.handlers if isinstance(h, OrbitLogHandler)]
        assert len(mine) == 1 and foreign in root.handlers
        logging.getLogger("uvicorn.error").warning("uvicorn says %s", "hi")
        logging.getLogger("orbit.x").info("not at WARNING")
        assert first.getvalue() == ""
        assert second.getvalue().endswith("WARNING uvicorn.error uvicorn says hi\n")
    finally:
        for h in [h for h in root.handlers if isinstance(h, OrbitLogHandler)]:
            root.removeHandler(h)
        root.removeHandler(foreign)
        root.setLevel(before_level)


def test_handler_follows_the_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = OrbitLogHandler()
    replaced = io.StringIO()
    monkeypatch.setattr("sys.stderr", replaced)
    assert handler.stream is replaced


def test_log_settings_are_validated() -> None:
    s = load_settings({"ORBIT_LOG_FORMAT": "JSON", "ORBIT_LOG_LEVEL": "debug"})
    assert (s.log_format, s.log_level) == ("json", "DEBUG")
    d = load_settings({})
    assert (d.log_format, d.log_level) == ("text", None)
    with pytest.raises(InvalidInput, match=r"ORBIT_LOG_FORMAT='xml'.*allowed text, json"):
        load_settings({"ORBIT_LOG_FORMAT": "xml"})
    with pytest.raises(InvalidInput, match=r"ORBIT_LOG_LEVEL='loud'.*allowed DEBUG"):
        load_settings({"ORBIT_LOG_LEVEL": "loud"})
