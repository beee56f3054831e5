"""The after-commit wake-up is a message Celery's own worker accepts (built without a Celery app
in the application's process), and its settings are validated like every other."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from celery import Celery

from orbit_tasks.errors import InvalidInput
from orbit_tasks.sender.wakeup import RELAY_TASK, Publisher, wakeup_message
from orbit_tasks.settings import load_settings


def test_the_message_has_the_shape_of_celerys_protocol_2() -> None:
    app = Celery(broker="memory://")
    celery_msg = app.amqp.as_task_v2("abc", RELAY_TASK, args=(), kwargs={})
    now = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
    body, headers, properties = wakeup_message("abc", now)
    # every header Celery's worker reads is there (stamps etc. are optional extras)
    required = set(celery_msg.headers) - {"replaced_task_nesting", "stamped_headers", "stamps"}
    assert required <= set(headers)
    assert headers["task"] == "orbit.sender.relay" and headers["id"] == headers["root_id"] == "abc"
    assert headers["expires"] == "2026-12-01T12:01:00+00:00"
    assert [list(body[0]), body[1], body[2]] == [list(celery_msg.body[0]), *celery_msg.body[1:]]
    assert properties == celery_msg.properties


def test_switch_and_bound_settings() -> None:
    assert load_settings({}).sender_wake_on_commit is True
    assert load_settings({"ORBIT_SENDER_WAKE_ON_COMMIT": "off"}).sender_wake_on_commit is False
    assert load_settings({"ORBIT_SENDER_WAKE_ON_COMMIT": "1"}).sender_wake_on_commit is True
    with pytest.raises(InvalidInput, match=r"ORBIT_SENDER_WAKE_ON_COMMIT='maybe' is not allowed"):
        load_settings({"ORBIT_SENDER_WAKE_ON_COMMIT": "maybe"})
    assert load_settings({}).sender_wake_timeout_seconds == 0.5
    with pytest.raises(InvalidInput, match=r"allowed 0.05\.\.5"):
        load_settings({"ORBIT_SENDER_WAKE_TIMEOUT_SECONDS": "9"})


def test_the_embedded_filesystem_broker_gets_one_message_file(tmp_path: Path) -> None:
    """Without CELERY_BROKER_URL the wake-up goes where the embedded workers read (the folders
    celeryconfig uses, created when missing)."""
    settings = load_settings({"ORBIT_VAR_DIR": str(tmp_path)})
    publisher = Publisher()
    assert publisher.publish(settings) is True
    (message,) = (tmp_path / "broker").iterdir()
    assert message.name.endswith(".orbit.sender.msg")
    doc = json.loads(message.read_text())
    assert doc["headers"]["task"] == RELAY_TASK
    assert doc["properties"]["delivery_info"]["routing_key"] == "orbit.sender"
