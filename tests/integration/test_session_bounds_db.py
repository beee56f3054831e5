"""The session bounds on the real MariaDB (issue 14): every connection of the registry's engines
sets them at connect, a claim that meets a locked job row gives up after the lock wait, and the
start check warns in one line when a session does not carry them."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, text, update

from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.db.engine import make_engine, single_statements
from orbit_tasks.db.faults import LOCK_WAIT_TIMEOUT, driver_code, is_transient_db
from orbit_tasks.db.platform_tables import archive_jobs
from orbit_tasks.db.schema_check import require_schema
from orbit_tasks.db.session_bounds import bounds_for_lease
from orbit_tasks.db.session_check import unmet_bounds, warn_unless_bounded
from tests.support.archive_jobs import (
    archive_env,
    create_job,
)
from tests.support.db import migrated_engine
from tests.support.scene import archive_scene

pytestmark = [pytest.mark.mariadb]


@contextmanager
def bounded_platform(url: str, lease: int) -> Iterator[Engine]:
    """A migrated platform database and an engine whose sessions carry the bounds of ``lease``."""
    with migrated_engine(url, "platform"):
        pass
    engine = make_engine(url, bounds=bounds_for_lease(lease))
    try:
        yield engine
    finally:
        engine.dispose()


def _session(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT @@session.innodb_lock_wait_timeout AS lock_wait, "
                "@@session.idle_transaction_timeout AS idle, @@session.time_zone AS tz"
            )
        ).one()
    return dict(row._mapping)


def test_every_connection_carries_the_bounds_of_its_lease(mariadb_url: str) -> None:
    with bounded_platform(mariadb_url, 8) as engine:
        assert _session(engine) == {"lock_wait": 1, "idle": 2, "tz": "+00:00"}
        assert unmet_bounds(engine) == []
        # a connection the server closed (as the idle bound does) is replaced by the pool
        with engine.connect() as conn:
            victim = conn.execute(text("SELECT CONNECTION_ID()")).scalar_one()
        with make_engine(mariadb_url).connect() as admin:
            admin.execute(text(f"KILL {int(victim)}"))
        assert _session(engine)["lock_wait"] == 1


def test_a_claim_that_meets_a_locked_job_row_gives_up_after_the_lock_wait(
    platform_engine: Engine, mariadb_url: str, tmp_path: Any
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, _, sid = archive_scene(
            ae.engine, name="locked", volume=tmp_path / "vol", label="locked", roots=5
        ).parts
        job = create_job(ae, ns, "tasks")
    bounded = make_engine(mariadb_url, bounds=bounds_for_lease(8))
    holder = make_engine(mariadb_url)
    try:
        with holder.connect() as conn:
            conn.begin()
            conn.execute(  # a silent session holding the row (an operator's shell, a frozen node)
                update(archive_jobs).where(archive_jobs.c.id == job.id).values(attempts=0)
            )
            started = time.monotonic()
            with pytest.raises(Exception) as caught:
                job_store.claim(bounded, ns, job.id, 8)
            waited = time.monotonic() - started
            conn.rollback()
        assert driver_code(caught.value) == LOCK_WAIT_TIMEOUT
        assert is_transient_db(caught.value)  # the runner's "transient": try later
        assert 0.9 < waited < 2.5  # innodb_lock_wait_timeout = 1 s at lease 8, not 50 s
    finally:
        bounded.dispose()
        holder.dispose()


def test_the_start_check_warns_when_a_session_does_not_carry_the_bounds(
    mariadb_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with bounded_platform(mariadb_url, 8) as engine:
        # What a proxy that drops SET statements, or an init rule that overrides them, leaves.
        @event.listens_for(engine, "connect")
        def _override(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("SET SESSION innodb_lock_wait_timeout = 50, idle_transaction_timeout = 0")
            cur.close()

        with caplog.at_level(logging.WARNING, logger="orbit.db.session_check"):
            require_schema(engine, "platform")  # starts anyway: a warning, not a refusal
        lines = [r.getMessage() for r in caplog.records if "db.session.unbounded" in r.getMessage()]
        assert len(lines) == 1
        assert "innodb_lock_wait_timeout=50 (wanted 1..1)" in lines[0]
        assert "idle_transaction_timeout=0 (wanted 1..2)" in lines[0]
        assert not warn_unless_bounded(engine, "platform")


def test_no_warning_when_the_bounds_hold(
    mariadb_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with bounded_platform(mariadb_url, 120) as engine, caplog.at_level(logging.WARNING):
        require_schema(engine, "platform")
    assert not [r for r in caplog.records if "db.session" in r.getMessage()]


def test_claims_and_confirms_hold_no_lock_after_their_statement(mariadb_url: str) -> None:
    """On the runner's connection (autocommit) a statement leaves no open transaction behind."""
    with bounded_platform(mariadb_url, 8) as engine, engine.connect() as conn:
        conn = single_statements(conn)
        with conn.begin():
            conn.execute(text("SELECT COUNT(*) FROM orbit_archive_jobs"))
        assert conn.execute(text("SELECT @@in_transaction")).scalar_one() == 0
