"""The fleet on RabbitMQ (issue 30 item 2; docs/operations.md "Choosing a broker"): every orbit.*
queue is a durable quorum queue with a delivery limit, wake-ups work as on Redis, an expired
beat tick is discarded on receipt, not run, the exporter's queue-depth gauge reads RabbitMQ, a
crashed worker's job is taken over, and the job of a worker whose broker restarts mid-job
finishes and verifies.

Each test has a RabbitMQ virtual host of its own on the shared server (tests/support/rabbitmq.py),
so tests running in parallel never share a queue; the broker restart runs on a private RabbitMQ
node of its own (restarting the shared one would cut every other test's workers off). The
SIGTERM handover on RabbitMQ is in tests/integration/test_rolling_restart.py.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.wakeups import publish_tick
from orbit_tasks.metrics.broker import BrokerSource
from orbit_tasks.queues import CONTROL_QUEUE, DELIVERY_LIMIT, SENDER_QUEUE, queue_name
from tests.support.archive_jobs import (
    ArchiveEnv,
    archive_env,
    assert_succeeded_exactly,
    create_job,
    tick_wait,
    wait_for,
    wait_state,
)
from tests.support.rabbitmq import (
    private_rabbitmq,
    queues_of,
    rabbitmq_answers,
    rabbitmq_vhost,
)
from tests.support.scene import archive_scene

pytestmark = pytest.mark.mariadb


@pytest.fixture
def vhost() -> Iterator[str]:
    if not rabbitmq_answers():
        pytest.fail("RabbitMQ does not answer on 127.0.0.1:5672 (scripts/ensure-services.sh)")
    with rabbitmq_vhost() as url:
        yield url


@pytest.fixture
def ae(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, vhost: str
) -> Iterator[ArchiveEnv]:
    with archive_env(mariadb_url, platform_engine, tmp_path, broker=vhost) as env:
        yield env


def test_the_archive_cycle_runs_end_to_end_on_quorum_queues(ae: ArchiveEnv, vhost: str) -> None:
    ns, _q, vol, sid = archive_scene(
        ae.engine, name="quorum", volume=ae.tmp / "vol", roots=40, batch_size=5, label="q"
    ).parts  # fmt: skip
    # each file write takes 1 s: the job's 9 files need more than one slice of 2 s, however the
    # group writes (up to 4 files in parallel) pack them, so continuations go through the queue
    # (at 0.3 s a write, one delivery wrote all 9 files in 2.7 s: "released" never came)
    w = ae.worker("w", [vol], control=True, failpoints="archive.after_file_write=sleep:1.0")
    job = create_job(ae, ns, "tasks")
    done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
    assert done.state is JobState.SUCCEEDED, done
    assert_succeeded_exactly(ae, done, vol)
    assert "archive.job.released" in w.text()  # continuations went through
    queues = queues_of(vhost)
    for name in (queue_name(sid), CONTROL_QUEUE):
        assert queues[name]["type"] == "quorum", queues
        assert queues[name]["durable"] == "true", queues
        assert "x-delivery-limit" in queues[name]["arguments"], queues
        assert str(DELIVERY_LIMIT) in queues[name]["arguments"], queues


def test_an_expired_beat_tick_is_dropped_not_run(ae: ArchiveEnv) -> None:
    """Beat's ``expires``: Celery sends it as the message's AMQP ``expiration`` too, and a quorum
    queue (RabbitMQ 3.10 and later) drops the message once it expired -- a tick nobody consumed
    in time never reaches a worker, so ticks never pile up into a burst. (On Redis the worker
    discards an expired message on receipt, from its ``expires`` header.)"""
    source = BrokerSource(ae.app, timeout=5.0, reply_seconds=0.5)
    publish_tick(1.0, app=ae.app)
    assert source.read().messages[CONTROL_QUEUE] == 1
    time.sleep(2.5)  # expired in the queue
    wait_for(lambda: source.read().messages[CONTROL_QUEUE] == 0, 10, "the broker's drop")
    w = ae.worker("control", [])
    time.sleep(2)
    assert "orbit.archive.tick[" not in w.text(), w.text()  # never received, never run
    publish_tick(30.0, app=ae.app)  # a fresh one runs
    wait_for(lambda: "succeeded in" in w.text(), 30, "a fresh tick run")


def test_the_queue_depth_gauge_reads_rabbitmq(ae: ArchiveEnv) -> None:
    sid = bytes(range(16))
    for _ in range(3):
        ae.publish(sid, b"\x01" * 16, b"\x02" * 16)
    source = BrokerSource(ae.app, timeout=5.0, reply_seconds=1.0)
    reading = source.read(lambda: [sid])
    # the archive queue holds the three wake-ups; the others were never declared in this vhost
    # (a failed passive declare closes its AMQP channel: each queue is read on its own)
    assert dict(reading.messages) == {queue_name(sid): 3, CONTROL_QUEUE: 0, SENDER_QUEUE: 0}
    assert reading.consumers == {}


def test_the_consumers_gauge_sees_the_workers_on_rabbitmq(ae: ArchiveEnv) -> None:
    _ns, _q, vol, sid = archive_scene(
        ae.engine, name="seen", volume=ae.tmp / "vol", roots=5, batch_size=5, label="seen"
    ).parts  # fmt: skip
    ae.worker("w", [vol], control=True)
    source = BrokerSource(ae.app, timeout=5.0, reply_seconds=2.0)
    reading = wait_for(lambda: source.read(lambda: [sid]), 10, "a reading")
    assert reading.consumers == {queue_name(sid): 1, CONTROL_QUEUE: 1}, reading


def test_a_crashed_worker_is_taken_over_and_the_job_verifies(ae: ArchiveEnv) -> None:
    ns, _q, vol, _sid = archive_scene(
        ae.engine, name="crash", volume=ae.tmp / "vol", roots=60, batch_size=5, label="crash"
    ).parts  # fmt: skip
    a = ae.worker("a", [vol], failpoints="archive.after_confirm=sleep:0.3")
    job = create_job(ae, ns, "tasks")
    wait_for(lambda: ae.job(ns, job.id).batches >= 2, 60, "two batches by a")
    a.signal(signal.SIGKILL)  # the whole node: main process and pool child
    a.proc.wait(timeout=10)
    at_kill = ae.job(ns, job.id)  # RUNNING under a's lease, or released at a slice's end
    b = ae.worker("b", [vol])
    done = tick_wait(
        ae,
        lambda: (j := ae.job(ns, job.id)).state in (JobState.SUCCEEDED, JobState.FAILED) and j,
        120,
        "the job finished by b",
    )
    assert done.state is JobState.SUCCEEDED, done
    assert_succeeded_exactly(ae, done, vol)
    if at_kill.state is JobState.RUNNING:
        assert "archive.job.takeover" in b.text()


@pytest.fixture
def private_broker() -> Iterator[tuple[str, object]]:
    with private_rabbitmq() as node:
        yield node.url, node


def test_a_broker_restart_mid_job_the_job_finishes_and_verifies(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, private_broker: tuple[str, object]
) -> None:
    url, node = private_broker
    with archive_env(mariadb_url, platform_engine, tmp_path, broker=url) as ae:
        ns, _q, vol, _sid = archive_scene(
            ae.engine, name="restart", volume=ae.tmp / "vol", roots=60, batch_size=5,
            label="restart",
        ).parts  # fmt: skip
        w = ae.worker("w", [vol], failpoints="archive.after_confirm=sleep:0.3")
        job = create_job(ae, ns, "tasks")
        wait_for(lambda: ae.job(ns, job.id).batches >= 2, 60, "two batches")
        node.stop()  # type: ignore[attr-defined]
        time.sleep(2)
        node.start()  # type: ignore[attr-defined]
        done = tick_wait(
            ae,
            lambda: (j := ae.job(ns, job.id)).state in (JobState.SUCCEEDED, JobState.FAILED) and j,
            180,
            "the job finished after the broker restart",
        )
        assert done.state is JobState.SUCCEEDED, done
        assert_succeeded_exactly(ae, done, vol)
        assert w.proc.poll() is None  # the worker lived through it and reconnected
