"""Contract of the archive job store (SPEC §5) on SQLite and MariaDB, at exact lease boundaries.

The store reads time through one seam (``clock=``); a ``FixedClock`` stands at
``lease_until - 1 us``, ``= lease_until`` and ``+ 1 us`` without sleeping. A lease is expired
only strictly after its end (``lease_until < now``): at ``= lease_until`` it still belongs to its
owner, for a claim, a takeover, the owner's lease check and an abandon alike.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.jobs import ErrorCode, Job, JobState
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.db.engine import DB_CLOCK, FixedClock, db_now
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans
from orbit_tasks.errors import IllegalState, LeaseLost
from orbit_tasks.ids import new_id
from orbit_tasks.platform import store
from orbit_tasks.settings import load_settings
from tests.support.archive_jobs import make_volume

T0 = dt.datetime(2026, 5, 17, 8, 30, 0, 250000)
US = dt.timedelta(microseconds=1)
LEASE = 30
SHA = "ab" * 32


@pytest.fixture
def engine(any_platform_engine: Engine) -> Engine:
    return any_platform_engine


def _job(engine: Engine, storage: bytes | None = None) -> Job:
    """A PENDING job row (created at T0) of a new namespace, as a tick would insert it, with
    its plan pointing at it."""
    job_id = new_id()
    with engine.begin() as conn:
        ns = store.create_namespace(conn, f"contract-{job_id.hex()[-8:]}")
        conn.execute(
            insert(archive_jobs).values(
                namespace_id=ns, id=job_id, kind="events", plan_revision=1, policy_revision=1,
                storage_id=storage or new_id(), batch_size=10, max_bytes=1 << 20,
                state="PENDING", created_at=T0, updated_at=T0,
            )
        )  # fmt: skip
        conn.execute(
            insert(archive_plans).values(
                namespace_id=ns, kind="events", revision=1, enabled=True, policy_revision=1,
                storage_id=storage or new_id(), interval_seconds=86400, batch_size=10,
                max_bytes=1 << 20, next_run_at=T0, active_job_id=job_id, created_at=T0,
                updated_at=T0,
            )
        )  # fmt: skip
    return _read(engine, ns, job_id)


def _read(engine: Engine, ns: bytes, job_id: bytes) -> Job:
    with engine.connect() as conn:
        return job_store.require_job(conn, ns, job_id)


def _claim(engine: Engine, job: Job, at: dt.datetime) -> job_store.Claim | None:
    return job_store.claim(engine, job.namespace_id, job.id, LEASE, clock=FixedClock(at))


def test_claim_and_takeover_at_the_lease_boundary(engine: Engine) -> None:
    job = _job(engine)
    first = _claim(engine, job, T0)
    assert first is not None and not first.takeover
    row = _read(engine, job.namespace_id, job.id)
    assert row.state is JobState.RUNNING and row.lease_id == first.lease_id
    assert row.lease_until == T0 + dt.timedelta(seconds=LEASE) == first.job.lease_until
    assert row.attempts == 1 and row.revision == job.revision + 1
    assert row == first.job  # the claim's row is built in Python exactly as written
    end = row.lease_until
    assert end is not None
    assert _claim(engine, job, end - US) is None  # live
    assert _claim(engine, job, end) is None  # lease_until == now: still the owner's
    assert _read(engine, job.namespace_id, job.id) == row  # refused claims write nothing
    second = _claim(engine, job, end + US)  # one microsecond past: takeover
    assert second is not None and second.takeover and second.lease_id != first.lease_id
    taken = _read(engine, job.namespace_id, job.id)
    assert taken.attempts == 2 and taken.lease_until == end + US + dt.timedelta(seconds=LEASE)


def test_the_owner_keeps_its_lease_until_strictly_after_its_end(engine: Engine) -> None:
    job = _job(engine)
    c = _claim(engine, job, T0)
    assert c is not None and c.job.lease_until is not None
    end = c.job.lease_until
    job_store.check_lease(engine, c, clock=FixedClock(end - US))
    job_store.check_lease(engine, c, clock=FixedClock(end))  # same rule as the takeover
    with pytest.raises(LeaseLost):
        job_store.check_lease(engine, c, clock=FixedClock(end + US))


def test_a_taken_over_claim_is_fenced_out_of_every_write(engine: Engine) -> None:
    job = _job(engine)
    stale = _claim(engine, job, T0)
    assert stale is not None and stale.job.lease_until is not None
    owner = _claim(engine, job, stale.job.lease_until + US)
    assert owner is not None
    before = _read(engine, job.namespace_id, job.id)
    clock = FixedClock(stale.job.lease_until + 2 * US)
    with pytest.raises(LeaseLost):
        job_store.confirm(
            engine, stale, is_batch=False, roots=0, size=10, sha256=SHA, after="chain",
            lease_seconds=LEASE, clock=clock,
        )  # fmt: skip
    for write in (
        lambda: job_store.release(engine, stale, clock=clock),
        lambda: job_store.fail(engine, stale, ErrorCode.IO_ERROR, clock=clock),
        lambda: job_store.finalize(engine, stale, clock=clock),
        lambda: job_store.check_lease(engine, stale, clock=clock),
    ):
        with pytest.raises(LeaseLost):
            write()
    assert _read(engine, job.namespace_id, job.id) == before  # nothing written
    job_store.check_lease(engine, owner, clock=clock)


def test_confirm_chains_the_next_claim_with_the_clock_inside_the_update(engine: Engine) -> None:
    job = _job(engine)
    c = _claim(engine, job, T0)
    assert c is not None
    at = T0 + dt.timedelta(seconds=5)
    nxt = job_store.confirm(
        engine, c, is_batch=False, roots=0, size=100, sha256=SHA, after="chain",
        lease_seconds=LEASE, clock=FixedClock(at),
    )  # fmt: skip
    assert nxt is not None and nxt.lease_id != c.lease_id and not nxt.takeover
    row = _read(engine, job.namespace_id, job.id)
    assert row.lease_until == at + dt.timedelta(seconds=LEASE) and row.updated_at == at
    assert (row.attempts, row.batches, row.bytes, row.last_sha256) == (2, 0, 100, SHA)
    assert row.lease_id == nxt.lease_id and row.revision == nxt.job.revision
    assert row == dataclass_replace(nxt.job, lease_until=row.lease_until, updated_at=at)
    # the old lease id is dead although its lease_until has not passed
    with pytest.raises(LeaseLost):
        job_store.confirm(
            engine, c, is_batch=True, roots=1, size=1, sha256=SHA, after="keep",
            lease_seconds=LEASE, clock=FixedClock(at),
        )  # fmt: skip
    # the database clock in the same statements (no FixedClock): lease end = db now + lease
    kept = job_store.confirm(
        engine, nxt, is_batch=True, roots=3, size=50, sha256="cd" * 32, after="chain",
        lease_seconds=LEASE,
    )  # fmt: skip
    assert kept is not None
    with engine.connect() as conn:
        now = DB_CLOCK.now(conn)
    row = _read(engine, job.namespace_id, job.id)
    assert row.lease_until is not None
    assert (
        dt.timedelta(0)
        <= now + dt.timedelta(seconds=LEASE) - row.lease_until
        < dt.timedelta(seconds=5)
    )
    job_store.finalize(engine, kept)
    done = _read(engine, job.namespace_id, job.id)
    assert done.state is JobState.SUCCEEDED and done.lease_id is None and done.batches == 1
    with engine.connect() as conn:
        active = conn.execute(
            select(archive_plans.c.active_job_id).where(
                archive_plans.c.namespace_id == job.namespace_id
            )
        ).scalar()
    assert active is None


def test_release_and_fail_clear_the_lease(engine: Engine) -> None:
    job = _job(engine)
    c = _claim(engine, job, T0)
    assert c is not None
    job_store.release(engine, c, clock=FixedClock(T0 + US))
    row = _read(engine, job.namespace_id, job.id)
    assert row.state is JobState.PENDING and row.lease_id is None and row.lease_until is None
    assert row.updated_at == T0 + US and row.attempts == 1
    again = _claim(engine, job, T0 + 2 * US)  # from PENDING: not a takeover
    assert again is not None and not again.takeover
    job_store.fail(engine, again, ErrorCode.CHAIN_BROKEN, clock=FixedClock(T0 + 3 * US))
    failed = _read(engine, job.namespace_id, job.id)
    assert failed.state is JobState.FAILED and failed.error_code == "CHAIN_BROKEN"
    assert failed.lease_id is None and _claim(engine, job, T0 + 4 * US) is None


def test_abandon_of_running_only_strictly_after_the_lease_end(engine: Engine) -> None:
    job = _job(engine)
    c = _claim(engine, job, T0)
    assert c is not None and c.job.lease_until is not None
    end = c.job.lease_until
    for at in (end - US, end):
        with pytest.raises(IllegalState, match="live lease"):
            job_store.abandon(engine, job.namespace_id, job.id, actor="op", clock=FixedClock(at))
    assert _read(engine, job.namespace_id, job.id).state is JobState.RUNNING
    out = job_store.abandon(
        engine, job.namespace_id, job.id, actor="op", clock=FixedClock(end + US)
    )
    assert out.state is JobState.ABANDONED and out.lease_id is None
    with engine.connect() as conn:
        audit = conn.execute(
            select(audit_events.c.actor, audit_events.c.action, audit_events.c.created_at).where(
                audit_events.c.namespace_id == job.namespace_id
            )
        ).all()
    assert [tuple(a) for a in audit] == [("op", "archive.job.abandon", end + US)]
    with pytest.raises(LeaseLost):  # the abandoned claim is fenced out
        job_store.check_lease(engine, c, clock=FixedClock(end - US))


def test_retry_uses_the_clock(engine: Engine) -> None:
    job = _job(engine)
    c = _claim(engine, job, T0)
    assert c is not None
    job_store.fail(engine, c, ErrorCode.DISK_FULL, clock=FixedClock(T0 + US))
    out = job_store.retry(
        engine, job.namespace_id, job.id, actor="op", max_bytes=2 << 20,
        clock=FixedClock(T0 + 2 * US),
    )  # fmt: skip
    assert out.state is JobState.PENDING and out.error_code == "" and out.max_bytes == 2 << 20
    assert out.updated_at == T0 + 2 * US


def test_stall_rule_fires_on_the_takeover_one_microsecond_after_the_lease(
    engine: Engine, any_platform_url: str, tmp_path: Path
) -> None:
    """Two claims die without confirming anything; the third claim is a takeover only strictly
    after the second lease's end, and then attempts - batches - 1 = 2 >= max_stalls 2."""
    vol = tmp_path / "vol"
    sid = make_volume(engine, vol)
    job = _job(engine, storage=sid)
    first = _claim(engine, job, T0)
    assert first is not None and first.job.lease_until is not None
    second = _claim(engine, job, first.job.lease_until + US)
    assert second is not None and second.job.lease_until is not None
    end = second.job.lease_until
    settings = load_settings(
        {"ORBIT_DATABASE_URL": any_platform_url, "ORBIT_ARCHIVE_MAX_STALLS": "2"}
    )

    def run(at: dt.datetime) -> str:
        return runner.run_job(
            job.namespace_id.hex(), job.id.hex(), {sid.hex(): vol}, settings, engine=engine,
            publish=lambda *a, **k: None, clock=FixedClock(at),
        )  # fmt: skip

    assert run(end) == "not_claimed"  # lease_until == now: the dead claim still owns it
    assert _read(engine, job.namespace_id, job.id).attempts == 2
    assert run(end + US) == "failed"
    stalled = _read(engine, job.namespace_id, job.id)
    assert stalled.error_code == "STALLED" and stalled.attempts == 3 and stalled.batches == 0
    assert not (vol / job.namespace_id.hex()).exists()  # nothing was written


def test_the_database_clock_decides_without_a_fixed_clock(engine: Engine) -> None:
    """The production clock on both databases: a fresh claim holds a live lease, a claim whose
    lease ended an hour ago (written with a clock in the past) is taken over at once."""
    job = _job(engine)
    with engine.connect() as conn:
        now = db_now(conn)
    past = _claim(engine, job, now - dt.timedelta(hours=1))
    assert past is not None
    fresh = job_store.claim(engine, job.namespace_id, job.id, LEASE)
    assert fresh is not None and fresh.takeover
    job_store.check_lease(engine, fresh)
    assert job_store.claim(engine, job.namespace_id, job.id, LEASE) is None


def dataclass_replace(job: Job, **changes: object) -> Job:
    from dataclasses import replace

    return replace(job, **changes)  # type: ignore[arg-type]


def test_expire_lost_lease_is_fenced_by_the_dead_claims_own_live_lease(engine: Engine) -> None:
    """A dead pool child's lease (issue 25 item 5): only a compare-and-set on that claim's own
    lease id, while it is live, expires it; the job stays RUNNING and the next claim is a
    takeover."""
    job = _job(engine)
    first = _claim(engine, job, T0)
    assert first is not None and first.job.lease_until is not None
    at = FixedClock(T0 + dt.timedelta(seconds=5))
    held = _read(engine, job.namespace_id, job.id)
    # another lease id (a claim that moved on) matches nothing and writes nothing
    assert job_store.expire_lost_lease(engine, job.namespace_id, job.id, new_id(), clock=at) is None
    assert _read(engine, job.namespace_id, job.id) == held
    # the lease's last microsecond is still live (expirable); one after, it has expired anyway
    end = first.job.lease_until
    late = FixedClock(end + US)
    assert (
        job_store.expire_lost_lease(engine, job.namespace_id, job.id, first.lease_id, clock=late)
        is None
    )
    assert _read(engine, job.namespace_id, job.id) == held
    expired = job_store.expire_lost_lease(
        engine, job.namespace_id, job.id, first.lease_id, clock=FixedClock(end)
    )
    assert expired is not None
    assert expired == dataclasses.replace(held, lease_until=end - dt.timedelta(seconds=1))
    # no claim, confirm or operator change: attempts, revision and updated_at stay
    # the next claim, at once, is a takeover (the stall guard counts it)
    second = _claim(engine, job, end)
    assert second is not None and second.takeover
    assert second.job.attempts == first.job.attempts + 1
    # the new owner's live lease is never touched by its predecessor's mark
    assert (
        job_store.expire_lost_lease(engine, job.namespace_id, job.id, first.lease_id, clock=at)
        is None
    )
    assert _read(engine, job.namespace_id, job.id).lease_id == second.lease_id


def _files(*sizes: int) -> list[job_store.WrittenFile]:
    return [
        job_store.WrittenFile(is_batch=True, roots=10, size=size, sha256=f"{i:02x}" * 32)
        for i, size in enumerate(sizes, start=1)
    ]


def test_one_statement_confirms_a_group_as_its_files_would_one_by_one(engine: Engine) -> None:
    """Group durability: ``confirm_files`` of k files = k confirms (the first k-1 chaining):
    batches/attempts grow by the files chained, roots/bytes by their sums, the tail is the
    last file's; the fence is the claim and the prefix it extends, as for one file."""
    job = _job(engine)
    c = _claim(engine, job, T0)
    assert c is not None
    at = T0 + dt.timedelta(seconds=5)
    clock = FixedClock(at)
    manifest = job_store.confirm(
        engine, c, is_batch=False, roots=0, size=100, sha256=SHA, after="chain",
        lease_seconds=LEASE, clock=clock,
    )  # fmt: skip
    assert manifest is not None
    group = _files(10, 20, 30)
    nxt = job_store.confirm_files(
        engine, manifest, group, after="chain", lease_seconds=LEASE, clock=clock
    )
    assert nxt is not None and nxt.lease_id != manifest.lease_id
    row = _read(engine, job.namespace_id, job.id)
    assert (row.attempts, row.batches, row.roots, row.bytes) == (5, 3, 30, 160)
    assert row.last_sha256 == group[-1].sha256 and row.lease_id == nxt.lease_id
    assert row.revision == manifest.job.revision + 1  # one statement
    assert row == dataclass_replace(nxt.job, lease_until=row.lease_until, updated_at=at)
    # the claim it chained from is dead; so is a group built on a stale prefix
    with pytest.raises(LeaseLost):
        job_store.confirm_files(
            engine, manifest, _files(5, 5), after="chain", lease_seconds=LEASE, clock=clock
        )
    # a final group keeps the lease: attempts == batches + 1 for the finalize
    kept = job_store.confirm_files(
        engine, nxt, _files(7, 8), after="keep", lease_seconds=LEASE, clock=clock
    )
    assert kept is not None and kept.lease_id == nxt.lease_id
    row = _read(engine, job.namespace_id, job.id)
    assert (row.attempts, row.batches, row.roots, row.bytes) == (6, 5, 50, 175)
    assert row.attempts == row.batches + 1
    job_store.finalize(engine, kept)
    assert _read(engine, job.namespace_id, job.id).state is JobState.SUCCEEDED


def test_a_released_group_counts_the_claims_its_files_chained(engine: Engine) -> None:
    job = _job(engine)
    c = _claim(engine, job, T0)
    assert c is not None
    clock = FixedClock(T0 + US)
    m = job_store.confirm(
        engine, c, is_batch=False, roots=0, size=1, sha256=SHA, after="chain",
        lease_seconds=LEASE, clock=clock,
    )  # fmt: skip
    assert m is not None
    out = job_store.confirm_files(
        engine, m, _files(1, 1, 1, 1), after="release", lease_seconds=LEASE, clock=clock
    )
    assert out is None
    row = _read(engine, job.namespace_id, job.id)
    assert row.state is JobState.PENDING and row.lease_id is None
    # as four confirms one by one (three chained, the last released): the next claim from
    # PENDING counts its own attempt, the live claim's, as after any release
    assert (row.attempts, row.batches) == (5, 4)
    again = _claim(engine, row, T0 + 2 * US)
    assert again is not None and again.job.attempts == again.job.batches + 2
