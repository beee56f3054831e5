"""The real exporter process (``orbit metrics serve``) scraped over HTTP, against real data:
MariaDB, our Redis, real ``orbit worker archive`` processes, a Redis we stop and kill, a hung
platform database (a TCP proxy that stops forwarding), and the embedded defaults (SQLite and
the filesystem broker)."""

from __future__ import annotations

import datetime as dt
import os
import secrets
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text, update

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.business_tables import sender_outbox
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.platform_tables import archive_plans
from orbit_tasks.queues import queue_name
from orbit_tasks.sender import enqueue
from tests.support.archive_jobs import (
    archive_env,
    create_job,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_state,
)
from tests.support.cli import run_orbit
from tests.support.db import mariadb_database, migrated_engine, redis_url
from tests.support.metrics import extra_redis, names, running_exporter, series, value
from tests.support.tcp_proxy import tcp_proxy

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]

ARCHIVE_METRICS = {
    "orbit_archive_jobs",
    "orbit_archive_jobs_failed",
    "orbit_archive_leases_expired",
    "orbit_archive_oldest_pending_seconds",
    "orbit_archive_plans_overdue",
}


def _exporter_env(base: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k != "ORBIT_SENDER_DATABASE_URL"}
    env.update(ORBIT_METRICS_CACHE_SECONDS="1", ORBIT_LOG_LEVEL="INFO")
    env.update(extra)
    return env


@pytest.mark.slow
def test_unserved_storages_until_a_pinned_worker_serves_one(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q = make_namespace(platform_engine, "metrics-e2e")
        vol_a, vol_b = tmp_path / "vol-a", tmp_path / "vol-b"
        sid_a, sid_b = make_volume(platform_engine, vol_a), make_volume(platform_engine, vol_b)
        make_plan(platform_engine, ns, "events", sid_a)
        make_plan(platform_engine, ns, "audit", sid_b)
        seed(platform_engine, ns, q, "events", 12)
        seed(platform_engine, ns, q, "audit", 5)
        job_a = create_job(ae, ns, "events")  # the tick also creates the audit job on b
        a, b = sid_a.hex(), sid_b.hex()
        qa, qb = queue_name(sid_a), queue_name(sid_b)
        with running_exporter(_exporter_env(ae.env), tmp_path) as exporter:
            s = exporter.scrape()
            assert value(s, "orbit_up", source="platform_db") == 1
            assert value(s, "orbit_up", source="broker") == 1
            assert value(s, "orbit_up", source="business_db") is None  # not configured
            assert value(s, "orbit_archive_storage_unserved", storage=a) == 1
            assert value(s, "orbit_archive_storage_unserved", storage=b) == 1
            assert value(s, "orbit_archive_jobs", storage=a, kind="events", state="PENDING") == 1
            assert value(s, "orbit_archive_jobs", storage=b, kind="audit", state="PENDING") == 1
            for state in ("RUNNING", "SUCCEEDED", "FAILED", "ABANDONED"):
                assert value(s, "orbit_archive_jobs", storage=a, kind="events", state=state) == 0
            assert value(s, "orbit_queue_messages", queue=qa) == 1  # the tick's wake-up
            assert value(s, "orbit_queue_messages", queue=qb) == 1
            for queue in (qa, qb, "orbit.control", "orbit.sender"):
                assert value(s, "orbit_queue_consumers", queue=queue) == 0
            assert value(s, "orbit_archive_oldest_pending_seconds", storage=a) >= 0

            ae.worker("a", [vol_a])  # consumes only orbit.archive.<a>
            done = wait_state(ae, job_a, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
            assert done.state is JobState.SUCCEEDED, done
            s = exporter.wait_for(
                lambda s: value(s, "orbit_archive_jobs", storage=a, kind="events",
                                state="SUCCEEDED") == 1
                and value(s, "orbit_queue_consumers", queue=qa) == 1,
                30,
                "job a SUCCEEDED and a consumer on its queue",
            )  # fmt: skip
            assert value(s, "orbit_archive_storage_unserved", storage=a) == 0
            assert value(s, "orbit_archive_storage_unserved", storage=b) == 1
            assert value(s, "orbit_archive_jobs", storage=a, kind="events", state="PENDING") == 0
            assert value(s, "orbit_archive_jobs", storage=b, kind="audit", state="PENDING") == 1
            assert value(s, "orbit_queue_consumers", queue=qb) == 0
            assert value(s, "orbit_queue_consumers", queue="orbit.control") == 0
            assert value(s, "orbit_queue_messages", queue=qb) >= 1
            assert value(s, "orbit_archive_oldest_pending_seconds", storage=a) == 0
            assert value(s, "orbit_archive_confirmed_bytes", storage=a, kind="events") == (
                done.bytes
            )
            # Read from the jobs table (exact, survives restarts): roots, files, claims.
            roots = value(s, "orbit_archive_confirmed_roots", storage=a, kind="events")
            assert roots == done.roots and roots > 0
            files = done.batches + (1 if done.has_manifest else 0)
            assert value(s, "orbit_archive_confirmed_files", storage=a, kind="events") == files
            assert files >= 2
            assert value(s, "orbit_archive_claims", storage=a, kind="events") == done.attempts
            assert value(s, "orbit_archive_confirmed_roots", storage=b, kind="audit") == 0


def test_broker_stopped_then_killed_database_metrics_still_come(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    ns, _q = make_namespace(platform_engine, "metrics-broker")
    sid = make_volume(platform_engine, tmp_path / "vol")
    make_plan(platform_engine, ns, "events", sid)
    with (
        extra_redis(tmp_path) as redis_server,
        archive_env(mariadb_url, platform_engine, tmp_path) as ae,
    ):
        create_job(ae, ns, "events")
        env = _exporter_env(
            ae.env, CELERY_BROKER_URL=redis_server.url, ORBIT_METRICS_TIMEOUT_SECONDS="3"
        )
        with running_exporter(env, tmp_path) as exporter:
            s = exporter.scrape()
            assert value(s, "orbit_up", source="broker") == 1
            assert value(s, "orbit_queue_messages", queue=queue_name(sid)) == 0  # other Redis

            redis_server.signal(signal.SIGSTOP)  # hung: connections open, no answer
            time.sleep(1.1)  # past the cache window
            s, took = exporter.timed_scrape()
            assert value(s, "orbit_up", source="broker") == 0
            assert took < 3 + 2, took  # the time bound, plus the HTTP round trip
            assert value(s, "orbit_up", source="platform_db") == 1
            assert value(s, "orbit_archive_jobs", storage=sid.hex(), kind="events",
                         state="PENDING") == 1  # fmt: skip
            assert not names(s) & {
                "orbit_queue_messages",
                "orbit_queue_consumers",
                "orbit_archive_storage_unserved",
            }

            redis_server.signal(signal.SIGKILL)
            redis_server.proc.wait(timeout=10)
            start = time.monotonic()
            s = exporter.wait_for(
                lambda s: (
                    value(s, "orbit_up", source="broker") == 0
                    and value(s, "orbit_up", source="platform_db") == 1
                ),
                10,
                "broker down after the kill",
            )
            assert time.monotonic() - start < 10
            assert names(s) >= ARCHIVE_METRICS
            assert "metrics.source.down" in exporter.output()


def _outbox_rows(engine: Engine) -> None:
    """Rows in every state: 3 PENDING (one enqueued 2 h ago, one 23.5 h ago = 30 min before its
    deadline), 1 SENDING, 2 ACCEPTED, REVIEW 2 x DEADLINE_EXCEEDED and 1 x REJECTED."""
    ns, queue = secrets.token_hex(16), secrets.token_hex(16)
    ops = [secrets.token_hex(16) for _ in range(9)]
    with engine.begin() as conn:
        for i, op in enumerate(ops):
            enqueue(
                conn,
                namespace_id=ns,
                queue_id=queue,
                operation_id=op,
                request=f'{{"amount": 0.10000000000000000001, "i": {i}, "note": "😀"}}',
                source_ref=f"orders/{i}",
            )
    o = sender_outbox.c
    with engine.begin() as conn:
        now = db_now(conn)

        def row(i: int, **values: object) -> None:
            conn.execute(
                update(sender_outbox)
                .where(o.namespace_id == ns, o.operation_id == ops[i])
                .values(**values)
            )

        for i, hours in ((1, 2.0), (2, 23.5)):
            created = now - dt.timedelta(hours=hours)
            row(i, created_at=created, send_deadline_at=created + dt.timedelta(hours=24))
        row(3, state="SENDING", send_count=1, lease_epoch=1, wake_at=now + dt.timedelta(minutes=1))
        for i in (4, 5):
            row(i, state="ACCEPTED", wake_at=None, last_code="ACCEPTED",
                task_id=secrets.token_hex(16), receipt_json='{"task_id": "x"}')  # fmt: skip
        for i, code in ((6, "DEADLINE_EXCEEDED"), (7, "DEADLINE_EXCEEDED"), (8, "REJECTED")):
            row(i, state="REVIEW", wake_at=None, last_code=code)


def _assert_outbox(s: dict, max_age: float) -> None:  # type: ignore[type-arg]
    assert value(s, "orbit_up", source="business_db") == 1
    rows = {dict(k)["state"]: v for k, v in series(s, "orbit_outbox_rows").items()}
    assert rows == {"PENDING": 3, "SENDING": 1, "ACCEPTED": 2, "REVIEW": 3}
    review = {dict(k)["last_code"]: v for k, v in series(s, "orbit_outbox_review_rows").items()}
    assert review.pop("DEADLINE_EXCEEDED") == 2 and review.pop("REJECTED") == 1
    assert set(review.values()) == {0}  # every other REVIEW code, as a zero
    assert value(s, "orbit_outbox_rows_near_deadline") == 1
    age = value(s, "orbit_outbox_oldest_pending_seconds")
    assert age is not None and 23.5 * 3600 <= age <= max_age, age


def test_platform_database_hung_then_refusing_outbox_metrics_still_come(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    sid = make_volume(platform_engine, tmp_path / "vol")
    database = mariadb_url.rsplit("/", 1)[1]
    with (
        mariadb_database("orbit_mb") as business_url,
        migrated_engine(business_url, "business") as business,
        tcp_proxy("127.0.0.1", 3306) as proxy,
    ):
        _outbox_rows(business)
        started = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
        env.update(
            ORBIT_DATABASE_URL=f"mysql+mysqldb://root@127.0.0.1:{proxy.port}/{database}",
            ORBIT_SENDER_DATABASE_URL=business_url,
            CELERY_BROKER_URL=redis_url(4),
            ORBIT_VAR_DIR=str(tmp_path / "var"),
            ORBIT_METRICS_CACHE_SECONDS="1",
            ORBIT_METRICS_TIMEOUT_SECONDS="3",
            ORBIT_LOG_LEVEL="INFO",
        )
        with running_exporter(env, tmp_path) as exporter:
            s = exporter.scrape()
            assert value(s, "orbit_up", source="platform_db") == 1
            assert value(s, "orbit_archive_leases_expired", storage=sid.hex()) == 0
            _assert_outbox(s, 23.5 * 3600 + time.monotonic() - started + 5)

            proxy.freeze()  # the platform database hangs (no byte comes back)
            time.sleep(1.1)
            s, took = exporter.timed_scrape()
            assert took < 3 + 2, took
            assert value(s, "orbit_up", source="platform_db") == 0
            assert not names(s) & ARCHIVE_METRICS
            assert "orbit_archive_storage_unserved" not in names(s)
            _assert_outbox(s, 23.5 * 3600 + time.monotonic() - started + 5)
            # the broker still reports the fixed queues (storages: the last list it knew)
            assert value(s, "orbit_queue_messages", queue="orbit.control") == 0
            assert value(s, "orbit_queue_messages", queue=queue_name(sid)) == 0

            proxy.close()  # now it refuses connections
            s = exporter.wait_for(
                lambda s: (
                    value(s, "orbit_up", source="platform_db") == 0
                    and value(s, "orbit_up", source="business_db") == 1
                ),
                15,
                "platform down, business up",
            )
            _assert_outbox(s, 23.5 * 3600 + time.monotonic() - started + 5)


def test_embedded_defaults_sqlite_and_filesystem_broker(tmp_path: Path) -> None:
    """No server at all: SQLite platform database, filesystem broker. Messages are counted from
    the broker folder; consumers are not observable there (docs/metrics.md)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(ORBIT_VAR_DIR=str(tmp_path / "var"), ORBIT_METRICS_CACHE_SECONDS="0")

    def orbit(*args: str) -> str:
        proc = run_orbit(list(args), env)
        assert proc.returncode == 0, (args, proc.stderr)
        return proc.stdout.strip()

    orbit("db", "upgrade")
    orbit("namespace", "create", "embedded")
    sid = orbit("storage", "init", str(tmp_path / "vol"), "--create")
    orbit("policy", "set", "embedded", "events", "--archive-after", "1h")
    plan = ["--storage", sid, "--interval", "1d", "--batch-size", "10", "--max-bytes", "8MiB"]
    orbit("plan", "set", "embedded", "events", *plan, "--policy-revision", "1", "--enable")
    orbit("archive", "tick")  # creates the job and leaves its wake-up in the broker folder
    with running_exporter(env, tmp_path) as exporter:
        s = exporter.scrape()
    assert value(s, "orbit_up", source="platform_db") == 1
    assert value(s, "orbit_up", source="broker") == 1
    assert value(s, "orbit_archive_jobs", storage=sid, kind="events", state="PENDING") == 1
    assert value(s, "orbit_queue_messages", queue=f"orbit.archive.{sid}") == 1
    assert value(s, "orbit_queue_messages", queue="orbit.control") == 0
    assert not names(s) & {"orbit_queue_consumers", "orbit_archive_storage_unserved"}
    files = os.listdir(tmp_path / "var" / "broker")  # the probe left no message behind
    assert len(files) == 1 and files[0].endswith(f".orbit.archive.{sid}.msg"), files


def test_overdue_plans_use_the_database_clock(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    ns, _q = make_namespace(platform_engine, "metrics-overdue")
    sid = make_volume(platform_engine, tmp_path / "vol")
    make_plan(platform_engine, ns, "events", sid)  # due now: not overdue yet
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(
        ORBIT_DATABASE_URL=mariadb_url,
        CELERY_BROKER_URL=redis_url(4),
        ORBIT_VAR_DIR=str(tmp_path / "var"),
        ORBIT_METRICS_CACHE_SECONDS="0",
        ORBIT_TICK_SECONDS="30",
    )
    with running_exporter(env, tmp_path) as exporter:
        assert value(exporter.scrape(), "orbit_archive_plans_overdue", storage=sid.hex()) == 0
        with platform_engine.begin() as conn:
            conn.execute(
                update(archive_plans)
                .where(archive_plans.c.namespace_id == ns)
                .values(next_run_at=text("UTC_TIMESTAMP(6) - INTERVAL 61 SECOND"))
            )
        assert value(exporter.scrape(), "orbit_archive_plans_overdue", storage=sid.hex()) == 1
        with platform_engine.begin() as conn:
            conn.execute(update(archive_plans).values(enabled=False))
        assert value(exporter.scrape(), "orbit_archive_plans_overdue", storage=sid.hex()) == 0


def test_an_unreachable_database_at_start_is_reported_not_refused(tmp_path: Path) -> None:
    with tcp_proxy("127.0.0.1", 3306) as proxy:
        port = proxy.port
    # nothing listens on that port now: connection refused
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(
        ORBIT_DATABASE_URL=f"mysql+mysqldb://root@127.0.0.1:{port}/orbit",
        CELERY_BROKER_URL=redis_url(4),
        ORBIT_VAR_DIR=str(tmp_path / "var"),
        ORBIT_METRICS_TIMEOUT_SECONDS="2",
    )
    with running_exporter(env, tmp_path) as exporter:
        s = exporter.scrape()
        assert value(s, "orbit_up", source="platform_db") == 0
        assert value(s, "orbit_up", source="broker") == 1
        assert "db.schema.unchecked" in exporter.output()


def test_broker_recovers_after_its_connections_were_black_holed(tmp_path: Path) -> None:
    """Redis behind a proxy: the proxy hangs, then lets new connections through while the old
    ones stay silent forever (a route that died without a reset). Every broker call of the
    probe has a socket timeout, so the probe gets off the dead connections and the broker is
    back within a few scrapes."""
    with extra_redis(tmp_path) as redis_server, tcp_proxy("127.0.0.1", redis_server.port) as proxy:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
        env.update(
            ORBIT_DATABASE_URL=f"sqlite:///{tmp_path / 'platform.sqlite3'}",
            CELERY_BROKER_URL=f"redis://127.0.0.1:{proxy.port}/0",
            ORBIT_VAR_DIR=str(tmp_path / "var"),
            ORBIT_METRICS_CACHE_SECONDS="0",
            ORBIT_METRICS_TIMEOUT_SECONDS="2",
            ORBIT_LOG_LEVEL="INFO",
        )
        assert run_orbit(["db", "upgrade"], env).returncode == 0
        with running_exporter(env, tmp_path) as exporter:
            assert value(exporter.scrape(), "orbit_up", source="broker") == 1
            proxy.freeze()
            s, took = exporter.timed_scrape()
            assert value(s, "orbit_up", source="broker") == 0 and took < 2 + 2, took
            proxy.blackhole_existing()
            exporter.wait_for(
                lambda s: value(s, "orbit_up", source="broker") == 1, 30, "broker back"
            )
