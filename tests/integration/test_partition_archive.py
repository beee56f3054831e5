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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.archive.jobs import JobState
from tests.integration.archive_jobs_support import (
    ArchiveEnv,
    archive_env,
    assert_succeeded_exactly,
    create_job,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_for,
    wait_marker,
)

pytestmark = [pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

LEASE = 4  # the smallest the settings allow: idle-transaction bound 1 s, lock wait 1 s
SLICE = 1


@pytest.fixture
def ae(platform_engine: Engine, mariadb_url: str, tmp_path: Path) -> Iterator[ArchiveEnv]:
    with archive_env(
        mariadb_url,
        platform_engine,
        tmp_path,
        ORBIT_ARCHIVE_LEASE_SECONDS=str(LEASE),
        ORBIT_ARCHIVE_SLICE_SECONDS=str(SLICE),
    ) as env:
        yield env


def open_write_transactions(engine: Engine) -> int:
    """Transactions of other sessions that hold modified rows (the frozen holder's)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT COUNT(*) FROM information_schema.innodb_trx "
                    "WHERE trx_rows_modified > 0 AND trx_mysql_thread_id <> CONNECTION_ID()"
                )
            ).scalar_one()
        )


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
    ns, q = make_namespace(ae.engine, "frozen")
    vol = ae.tmp / "vol"
    sid = make_volume(ae.engine, vol, "frozen")
    make_plan(ae.engine, ns, "tasks", sid, batch_size=5)
    seed(ae.engine, ns, q, "tasks", 20)
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
    assert open_write_transactions(ae.engine) == 1

    # The server rolls the silent transaction back within the idle bound (1 s at this lease),
    # long before the lease ends: nothing waits for the frozen client.
    wait_for(lambda: open_write_transactions(ae.engine) == 0, 5, "the server's rollback")
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
