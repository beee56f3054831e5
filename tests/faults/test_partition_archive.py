"""A node frozen or cut off inside a write transaction on the job row (issue 14): the server rolls
its transaction back within the idle bound (db/session_bounds.py), so another worker takes the job
over right after the lease, and the frozen node's late writes are refused when it comes back.

The holder is stopped deterministically at the failpoint ``archive.finalize.before_commit`` (the
job row and the plan row written as SUCCEEDED, not committed: the one write of a claim with two
statements; claims and confirms are single autocommit statements). Then its whole process group
gets ``SIGSTOP`` (main process and pool child), as a paused VM or a debugger would.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.session_bounds import bounds_for_lease
from tests.support import netns
from tests.support.archive_jobs import (
    ArchiveEnv,
    archive_env,
    assert_succeeded_exactly,
    create_job,
    make_plan,
    seed,
    wait_for,
    wait_marker,
)
from tests.support.db import migrated_engine, open_write_transactions
from tests.support.scene import archive_scene

pytestmark = [pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

LEASE = 4  # the smallest the settings allow: idle-transaction bound 1 s, lock wait 1 s
SLICE = 1


@pytest.fixture
def archive_overrides() -> dict[str, str]:
    return {"ORBIT_ARCHIVE_LEASE_SECONDS": str(LEASE), "ORBIT_ARCHIVE_SLICE_SECONDS": str(SLICE)}


def tick_until(ae: ArchiveEnv, pred: object, timeout: float, what: str, every: float = 0.5):  # type: ignore[no-untyped-def]
    """Wait for ``pred()`` while ticking every ``every`` s as beat would (sweeps publish the
    wake-ups of expired leases)."""
    last = [0.0]

    def check():  # type: ignore[no-untyped-def]
        value = pred()  # type: ignore[operator]
        if not value and time.monotonic() - last[0] >= every:
            ae.tick()
            last[0] = time.monotonic()
        return value

    return wait_for(check, timeout, what, 0.1)


def test_frozen_holder_of_the_job_row_is_taken_over_after_the_lease(ae: ArchiveEnv) -> None:
    ns, q, vol, sid = archive_scene(
        ae.engine, name="frozen", volume=ae.tmp / "vol", roots=20, batch_size=5, label="frozen"
    ).parts
    marker = ae.tmp / "holding"
    # solo pool: the late COMMIT runs when the node comes back (a prefork parent would first
    # fire the overdue soft time limit inside the child, which rolls back as well)
    frozen = ae.worker(
        "frozen", [vol], failpoints=f"archive.finalize.before_commit=hold:{marker}", pool="solo"
    )
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)
    frozen.signal(signal.SIGSTOP)  # the whole process group
    stopped_at = time.monotonic()
    held = ae.job(ns, job.id)
    assert held.state is JobState.RUNNING  # SUCCEEDED is written, not committed
    assert open_write_transactions(ae.engine) == [2]  # job and plan rows

    # The server rolls the silent transaction back within the idle bound (1 s at this lease),
    # long before the lease ends: nothing waits for the frozen client.
    wait_for(lambda: not open_write_transactions(ae.engine), 5, "the server's rollback")
    rolled_back_after = time.monotonic() - stopped_at
    assert rolled_back_after < LEASE

    taker = ae.worker("taker", [vol])
    taken = tick_until(
        ae,
        lambda: (j := ae.job(ns, job.id)).state is JobState.SUCCEEDED and j,
        2 * LEASE + 10,
        "the takeover",
    )
    took = time.monotonic() - stopped_at
    assert "archive.job.takeover" in taker.text()
    assert taken.attempts > held.attempts
    print(f"rolled back after {rolled_back_after:.2f} s, SUCCEEDED {took:.2f} s after the freeze")
    exported = assert_succeeded_exactly(ae, taken, vol)
    assert exported  # every root of the range, once (checked against SQL above)

    # The frozen node comes back: its COMMIT finds its session gone; nothing it does changes the
    # job or the files.
    before = ae.job(ns, job.id)
    files = sorted(p.name for p in (vol.rglob("*")) if p.is_file())
    marker.unlink()
    frozen.signal(signal.SIGCONT)
    wait_for(lambda: "archive.job.transient" in frozen.text(), 20, "the late COMMIT refused")
    time.sleep(0.5)
    assert ae.job(ns, job.id) == before
    assert sorted(p.name for p in (vol.rglob("*")) if p.is_file()) == files
    assert "exited with" not in taker.text()  # no pool child of the taker was killed


# --- a real network cut: two worker hosts in network namespaces -------------------------------

NET_LEASE = 8  # idle-transaction bound 2 s, lock wait 1 s, client read/write timeout 4 s


@pytest.fixture
def net(tmp_path: Path) -> Iterator[tuple[ArchiveEnv, list[netns.Host]]]:
    netns.require_tools()
    with (
        netns.private_mariadb() as db_port,
        netns.private_redis() as redis_port,
        netns.hosts(2) as hosts,
    ):
        admin = create_engine(f"mysql+mysqldb://root@127.0.0.1:{db_port}/mysql")
        with admin.begin() as conn:
            conn.execute(text("CREATE DATABASE orbit CHARACTER SET utf8mb4"))
        admin.dispose()
        url = f"mysql+mysqldb://root@127.0.0.1:{db_port}/orbit"
        with migrated_engine(url, "platform") as engine, archive_env(
            url, engine, tmp_path, broker=f"redis://127.0.0.1:{redis_port}/0",
            ORBIT_ARCHIVE_LEASE_SECONDS=str(NET_LEASE), ORBIT_ARCHIVE_SLICE_SECONDS="2",
        ) as ae:  # fmt: skip
            ae.db_port, ae.redis_port = db_port, redis_port  # type: ignore[attr-defined]
            yield ae, hosts


def _host_env(ae: ArchiveEnv, host: netns.Host) -> dict[str, str]:
    """The worker on ``host`` reaches the servers at its end of the veth pair."""
    return {
        "ORBIT_DATABASE_URL": f"mysql+mysqldb://root@{host.host_ip}:{ae.db_port}/orbit",  # type: ignore[attr-defined]
        "CELERY_BROKER_URL": f"redis://{host.host_ip}:{ae.redis_port}/0",  # type: ignore[attr-defined]
    }


def test_a_holder_cut_off_by_the_network_is_taken_over_and_serves_again_after_healing(
    net: tuple[ArchiveEnv, list[netns.Host]],
) -> None:
    ae, (host_a, host_b) = net
    ns, q, vol, sid = archive_scene(
        ae.engine, name="cut", volume=ae.tmp / "vol", roots=20, batch_size=5, label="cut"
    ).parts
    seed(ae.engine, ns, q, "events", 20)
    marker = ae.tmp / "holding"
    holder = ae.worker(
        "holder", [vol], failpoints=f"archive.finalize.before_commit=hold@1:{marker}",
        prefix=host_a.prefix, extra_env=_host_env(ae, host_a),
    )  # fmt: skip
    job = create_job(ae, ns, "tasks").id  # the holder claims it and holds at its finalize
    wait_marker(marker)
    host_a.cut()
    cut_at = time.monotonic()
    wait_for(lambda: not open_write_transactions(ae.engine), 10, "the server's rollback")
    rolled_back = time.monotonic() - cut_at
    marker.unlink()  # the holder goes on, into the blackhole: its COMMIT gets no answer

    taker = ae.worker("taker", [vol], prefix=host_b.prefix, extra_env=_host_env(ae, host_b))
    taken = tick_until(
        ae,
        lambda: (j := ae.job(ns, job)).state is JobState.SUCCEEDED and j,
        2 * NET_LEASE + 10,
        "the takeover",
    )
    took = time.monotonic() - cut_at
    assert "archive.job.takeover" in taker.text()
    assert_succeeded_exactly(ae, taken, vol)
    # The cut-off holder gives up by itself, on time: its own socket times out or its soft
    # time limit fires (the main process is no longer stuck in a read of the blackholed broker
    # socket). Its late COMMIT is refused and changes nothing.
    wait_for(
        lambda: (
            "archive.job.transient" in holder.text() or "archive.job.time_limit" in holder.text()
        ),
        30,
        "the holder's own timeout",
    )
    gave_up = time.monotonic() - cut_at
    assert ae.job(ns, job) == taken

    # The other job is left to the healed holder alone.
    taker.stop()
    ae.workers.remove(taker)
    time.sleep(max(0.0, 20 - (time.monotonic() - cut_at)))  # a 20 s partition in all
    host_a.heal()
    healed_at = time.monotonic()
    make_plan(ae.engine, ns, "events", sid, batch_size=5)
    other = create_job(ae, ns, "events").id
    done = tick_until(
        ae,
        lambda: (j := ae.job(ns, other)).state is JobState.SUCCEEDED and j,
        90,
        "the healed holder serving again",
        every=1.0,
    )
    served = time.monotonic() - healed_at
    assert holder.proc.poll() is None  # the same process, never restarted
    assert "archive.job.succeeded" in holder.text() and other.hex() in holder.text()
    assert_succeeded_exactly(ae, done, vol)
    print(
        f"rolled back {rolled_back:.1f} s after the cut, taken over and SUCCEEDED {took:.1f} s, "
        f"holder gave up {gave_up:.1f} s; healed holder finished a job {served:.1f} s after healing"
    )


# --- the embedded default ---------------------------------------------------------------------


def test_sqlite_a_frozen_holder_of_the_write_lock_delays_everyone_until_it_resumes(
    tmp_path: Path,
) -> None:
    """SQLite has no server to roll a silent transaction back: a frozen holder of the write lock
    (``BEGIN IMMEDIATE``) keeps every writer out until it resumes or dies (the embedded default
    is one node; docs/operations.md). What the bounds still give: a claim that meets the lock
    gives up after the busy bound (1 s at lease 4) as a transient fault, never a pool child
    killed by its time limit, and the job finishes once the holder goes on."""
    url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
    with migrated_engine(url, "platform"):
        pass
    engine = make_engine(url, bounds=bounds_for_lease(LEASE))
    try:
        with archive_env(
            url, engine, tmp_path,
            ORBIT_ARCHIVE_LEASE_SECONDS=str(LEASE), ORBIT_ARCHIVE_SLICE_SECONDS=str(SLICE),
        ) as ae:  # fmt: skip
            ns, q, vol, sid = archive_scene(
                engine, name="lite", volume=tmp_path / "vol", roots=20, batch_size=5, label="lite"
            ).parts
            marker = tmp_path / "holding"
            frozen = ae.worker(
                "frozen", [vol], failpoints=f"archive.finalize.before_commit=hold:{marker}",
                pool="solo",
            )  # fmt: skip
            job = create_job(ae, ns, "tasks")
            wait_marker(marker)
            frozen.signal(signal.SIGSTOP)
            # Every transaction on SQLite begins IMMEDIATE (reads too), so nothing starts while
            # the lock is held: the claim of a wake-up, run here by the real runner.
            started = time.monotonic()
            outcome = runner.run_job(
                ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings, engine=engine
            )
            waited = time.monotonic() - started
            assert outcome == "transient"  # "database is locked": not mine now, try later
            assert waited < LEASE - 1  # ends before the soft time limit (2 s at lease 4)
            with sqlite3.connect(tmp_path / "platform.sqlite3") as raw:  # a WAL reader
                (state,) = raw.execute(
                    "SELECT state FROM orbit_archive_jobs WHERE id = ?", (job.id,)
                ).fetchone()
            assert state == "RUNNING"  # SUCCEEDED is written, not committed
            marker.unlink()
            frozen.signal(signal.SIGCONT)  # the holder commits: nobody else could write
            done = wait_for(
                lambda: (j := ae.job(ns, job.id)).state is JobState.SUCCEEDED and j, 30, "done"
            )
            assert "archive.job.succeeded" in frozen.text()
            assert_succeeded_exactly(ae, done, vol)
    finally:
        engine.dispose()


# --- the broker comes back ------------------------------------------------------------------

TICK = 2.0  # the test acts as beat


def test_after_a_redis_restart_work_resumes_within_one_tick(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Issue 14: after a Redis restart the first progress came after up to 2.4 tick periods
    (kombu's reconnect waits of 2, 4, 6 ... s). The worker now reconnects every second
    (orbit_tasks/broker_reconnect.py), so the first tick after the restart whose wake-up finds
    the worker's queue declared again is at most one tick later."""
    with netns.private_redis_server() as broker, archive_env(
        mariadb_url, platform_engine, tmp_path, broker=f"redis://127.0.0.1:{broker.port}/0",
    ) as ae:  # fmt: skip
        ns, q, vol, sid = archive_scene(
            ae.engine,
            name="restart",
            volume=tmp_path / "vol",
            roots=10,
            batch_size=5,
            label="restart",
        ).parts
        w = ae.worker("w", [vol])
        broker.restart(down_seconds=13)  # the worker has been failing to reconnect for 13 s
        back = time.monotonic()
        job = create_job(ae, ns, "tasks")  # the first tick once Redis answers
        claimed = tick_until(
            ae, lambda: ae.job(ns, job.id).attempts > 0, 30, "the first claim", every=TICK
        )
        progress = time.monotonic() - back
        print(f"first claim {progress:.1f} s after Redis came back")
        assert claimed
        assert progress <= TICK + 1.5, progress
        assert "archive.job.claimed" in w.text()
