"""The seed CHECK constraints reject bad rows in the database itself (SPEC §2, seeds/).

Each table gets valid rows first (so that a too-strict constraint fails the test), then one bad
row per rule; the error must name the constraint that fired. The platform tables run on SQLite
and MariaDB; the business tables on MariaDB (their MySQL-only expressions are the contract).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, Table, func, insert, select
from sqlalchemy.exc import DBAPIError

from orbit_tasks.db.business_tables import sender_outbox
from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans
from orbit_tasks.ids import new_id

NOW = datetime(2026, 11, 29, 12, 0, 0, 123456)


@pytest.fixture
def platform(any_platform_url: str) -> Iterator[Engine]:
    engine = make_engine(any_platform_url)
    yield engine
    engine.dispose()


def _insert(engine: Engine, table: Table, row: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(insert(table).values(**row))


def _rejected(engine: Engine, table: Table, row: dict[str, Any], constraint: str) -> None:
    with pytest.raises(DBAPIError) as info:
        _insert(engine, table, row)
    assert constraint in str(info.value.orig), str(info.value.orig)


def _count(engine: Engine, table: Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar())


def _plan(**changes: Any) -> dict[str, Any]:
    row = dict(
        namespace_id=new_id(),
        kind="tasks",
        policy_revision=1,
        storage_id=new_id(),
        interval_seconds=3600,
        batch_size=100,
        max_bytes=1048576,
        next_run_at=NOW,
    )
    row.update(changes)
    return row


def test_archive_plan_checks(platform: Engine) -> None:
    _insert(platform, archive_plans, _plan())
    _insert(platform, archive_plans, _plan(interval_seconds=2592000, batch_size=1))
    _insert(platform, archive_plans, _plan(kind="idempotency", max_bytes=1073741824))
    cfg = "ck_archive_plan_config"
    _rejected(platform, archive_plans, _plan(batch_size=101), cfg)
    _rejected(platform, archive_plans, _plan(batch_size=0), cfg)
    _rejected(platform, archive_plans, _plan(interval_seconds=3599), cfg)
    _rejected(platform, archive_plans, _plan(interval_seconds=2592001), cfg)
    _rejected(platform, archive_plans, _plan(max_bytes=1048575), cfg)
    _rejected(platform, archive_plans, _plan(max_bytes=1073741825), cfg)
    _rejected(platform, archive_plans, _plan(policy_revision=0), cfg)
    _rejected(platform, archive_plans, _plan(kind="history"), "ck_archive_plan_kind")
    assert _count(platform, archive_plans) == 3


def _job(**changes: Any) -> dict[str, Any]:
    row = dict(
        namespace_id=new_id(),
        id=new_id(),
        kind="events",
        plan_revision=1,
        policy_revision=1,
        storage_id=new_id(),
        batch_size=50,
        max_bytes=256 * 1048576,
    )
    row.update(changes)
    return row


def test_archive_job_checks(platform: Engine) -> None:
    lease = dict(lease_id=new_id(), lease_until=NOW + timedelta(seconds=120))
    _insert(platform, archive_jobs, _job())
    _insert(platform, archive_jobs, _job(state="RUNNING", **lease))
    _insert(platform, archive_jobs, _job(state="FAILED", error_code="STALLED"))
    lease_ck = "ck_archive_job_lease"
    _rejected(platform, archive_jobs, _job(state="RUNNING"), lease_ck)
    _rejected(platform, archive_jobs, _job(state="RUNNING", lease_id=new_id()), lease_ck)
    _rejected(platform, archive_jobs, _job(state="PENDING", **lease), lease_ck)
    _rejected(platform, archive_jobs, _job(state="SUCCEEDED", lease_until=NOW), lease_ck)
    _rejected(platform, archive_jobs, _job(state="DONE"), "ck_archive_job_state")
    _rejected(platform, archive_jobs, _job(batch_size=101), "ck_archive_job_config")
    _rejected(platform, archive_jobs, _job(max_bytes=1048575), "ck_archive_job_config")
    _rejected(platform, archive_jobs, _job(plan_revision=0), "ck_archive_job_config")
    assert _count(platform, archive_jobs) == 3


def _outbox(**changes: Any) -> dict[str, Any]:
    created = NOW
    row = dict(
        namespace_id=new_id().hex(),
        queue_id=new_id().hex(),
        operation_id=new_id().hex(),
        request_json='{"amount":12345678901234567890.123456789,"memo":"🚀 𝄞"}',
        request_digest=b"\x01" * 32,
        state="PENDING",
        send_count=0,
        lease_epoch=0,
        wake_at=created,
        send_deadline_at=created + timedelta(hours=24),
        last_code="",
        task_id=None,
        receipt_json=None,
        created_at=created,
        updated_at=created,
    )
    row.update(changes)
    row.setdefault("idempotency_key", f"op-{row['operation_id']}")
    return row


@pytest.mark.mariadb
def test_sender_outbox_checks(business_engine: Engine) -> None:
    eng = business_engine
    accepted = dict(
        state="ACCEPTED",
        wake_at=None,
        task_id=new_id().hex(),
        receipt_json=json.dumps({"task_id": "x", "n": 1}),
        send_count=3,
        lease_epoch=3,
    )
    _insert(eng, sender_outbox, _outbox())
    _insert(eng, sender_outbox, _outbox(**accepted))
    _insert(eng, sender_outbox, _outbox(state="SENDING", send_count=100, lease_epoch=100))
    _insert(eng, sender_outbox, _outbox(state="REVIEW", wake_at=None, last_code="DEADLINE"))

    state = "ck_sender_state"
    _rejected(eng, sender_outbox, _outbox(**{**accepted, "receipt_json": None}), state)
    _rejected(eng, sender_outbox, _outbox(**{**accepted, "task_id": None}), state)
    _rejected(eng, sender_outbox, _outbox(**{**accepted, "wake_at": NOW}), state)
    _rejected(eng, sender_outbox, _outbox(wake_at=None), state)
    _rejected(eng, sender_outbox, _outbox(state="DONE"), state)
    count = "ck_sender_count"
    _rejected(eng, sender_outbox, _outbox(send_count=101, lease_epoch=101), count)
    _rejected(eng, sender_outbox, _outbox(send_count=2, lease_epoch=3), count)
    _rejected(eng, sender_outbox, _outbox(send_count=3, lease_epoch=2), count)
    _rejected(eng, sender_outbox, _outbox(state="SENDING"), "ck_sender_lease")
    deadline = "ck_sender_deadline"
    late = NOW + timedelta(hours=24, microseconds=1)
    _rejected(eng, sender_outbox, _outbox(send_deadline_at=late), deadline)
    _rejected(eng, sender_outbox, _outbox(send_deadline_at=NOW), deadline)
    _rejected(eng, sender_outbox, _outbox(request_json="{not json"), "ck_sender_document")
    _rejected(eng, sender_outbox, _outbox(**{**accepted, "receipt_json": "{"}), "ck_sender_receipt")
    assert _count(eng, sender_outbox) == 4
