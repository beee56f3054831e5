"""Every SQL statement on archive jobs (SPEC §5): claims, fenced writes, manual operations.

Ownership is compare-and-set on the job row: a claim moves PENDING / expired RUNNING to RUNNING
with a fresh random ``lease_id``; every later write of that claim is fenced by
``lease_id = :mine AND state = 'RUNNING'`` (plus the confirmed ``batches``/``last_sha256`` it
builds on). ``rowcount != 1`` means the lease is lost: :class:`LeaseLost`.

Time comes from one seam, a :class:`~orbit_tasks.db.engine.Clock` (default: the database
clock). Decisions taken in Python (claimable? abandon allowed?) use ``clock.now`` read in the
same transaction; writes put ``clock.sql()`` inside the statement (``updated_at``, the chained
lease end, the lease check), so a confirm needs no separate clock read. Tests pass a
``FixedClock`` to stand at ``lease_until - 1 us``, ``= lease_until`` and ``+ 1 us``.

Write functions take an ``Engine`` (one transaction on a pooled connection) or a ``Connection``
(the runner keeps one per claim chain; each call is one transaction on it).
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)

from orbit_tasks import failpoints
from orbit_tasks.archive import plans as plan_rules
from orbit_tasks.archive.claims import After, Guard, confirm_guard
from orbit_tasks.archive.format.chain import ChainProgress
from orbit_tasks.archive.jobs import (
    ErrorCode,
    Job,
    JobFailure,
    JobState,
    check_abandon,
    check_expected_revision,
    check_retry,
    claimable,
    is_takeover,
)
from orbit_tasks.archive.ranges import (
    ArchiveRange,
    Bound,
    EarlierSuccess,
    RangeInputs,
    cut_short,
    derive_range,
    range_until,
)
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.store.controls import GENERATION_SQL, NO_GENERATION, NO_GENERATION_SQL
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.db.engine import atomic as atomic_transaction
from orbit_tasks.db.platform_tables import archive_job_ends as E
from orbit_tasks.db.platform_tables import archive_jobs as J
from orbit_tasks.db.platform_tables import archive_plans, archive_policies, job_checks
from orbit_tasks.errors import Command, InvalidInput, LeaseLost, NotFound, StaleRevision
from orbit_tasks.ids import new_id, random_id
from orbit_tasks.platform.store import insert_audit

Bind = Engine | Connection


@dataclass(frozen=True)
class Claim:
    """One claim: the job row as this claim wrote it, and whether it took over a dead claim.

    ``job`` is built in Python from what the claim wrote (never re-read). Its ``lease_until``
    and ``updated_at`` are exact for a claim by :func:`claim`; a claim chained by
    :func:`confirm` keeps the previous values there, because the database clock sets them
    inside that UPDATE (nothing in the runner decides on them: the fence is the lease id)."""

    job: Job
    lease_id: bytes
    takeover: bool
    claimed_at: datetime  # clock at the claim (of the chain's first claim when chained)


def _key(ns_id: bytes, job_id: bytes) -> Any:
    return and_(J.c.namespace_id == ns_id, J.c.id == job_id)


@contextmanager
def _transaction(bind: Bind, *, atomic: bool = False) -> Iterator[Connection]:
    """One transaction on ``bind``. On the runner's connection (autocommit on MySQL, see
    ``db.engine.single_statements``) each statement commits by itself unless ``atomic``: a
    compare-and-set needs no transaction around it, and holds its lock only while it runs."""
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            yield conn
    elif atomic:
        with atomic_transaction(bind):
            yield bind
    else:
        with bind.begin():
            yield bind


def get_job(conn: Connection, ns_id: bytes, job_id: bytes) -> Job | None:
    row = conn.execute(select(J).where(_key(ns_id, job_id))).first()
    return None if row is None else Job.from_row(row)


def require_job(conn: Connection, ns_id: bytes, job_id: bytes) -> Job:
    job = get_job(conn, ns_id, job_id)
    if job is None:
        raise NotFound(f"job {job_id.hex()} does not exist in namespace {ns_id.hex()}")
    return job


# --- claim / confirm / release / fail / finalize -------------------------------------------------


def claim(
    bind: Bind, ns_id: bytes, job_id: bytes, lease_seconds: int, *, clock: Clock = DB_CLOCK
) -> Claim | None:
    """Compare-and-set PENDING (or RUNNING with ``lease_until < now``) -> RUNNING.

    The row and the clock are read in one statement. Returns None when the job is not
    claimable or another node won the race.
    """
    with _transaction(bind) as conn:
        row = conn.execute(select(J, clock.sql().label("clock_now")).where(_key(ns_id, job_id)))
        found = row.first()
        if found is None:
            return None
        job, now = Job.from_row(found), found.clock_now
        if not claimable(job.state, job.lease_until, now):
            return None
        lease_id = random_id()
        lease_until = now + timedelta(seconds=lease_seconds)
        result = conn.execute(
            update(J)
            .where(*_as_seen(job, now))
            .values(
                state=JobState.RUNNING.value,
                lease_id=lease_id,
                lease_until=lease_until,
                attempts=J.c.attempts + 1,
                revision=J.c.revision + 1,
                updated_at=now,
            )
        )
        if result.rowcount != 1:
            return None
    claimed = replace(
        job,
        state=JobState.RUNNING,
        lease_id=lease_id,
        lease_until=lease_until,
        attempts=job.attempts + 1,
        revision=job.revision + 1,
        updated_at=now,
    )
    return Claim(claimed, lease_id, is_takeover(job.state), now)


def _as_seen(job: Job, now: datetime) -> list[Any]:
    """Compare-and-set on the row as read: same state and revision, and for RUNNING an expired
    lease (``lease_until < now``) — the condition of a claim or a manual change."""
    cond = [_key(job.namespace_id, job.id), J.c.state == job.state.value]
    cond.append(J.c.revision == job.revision)
    if job.state is JobState.RUNNING:
        cond.append(J.c.lease_until < now)
    return cond


def lease_fence(
    ns_id: Any, job_id: Any, lease_id: Any, *, prefix: tuple[Any, Any] | None = None
) -> list[Any]:
    """The fence of every write of a claim (docs/architecture.md, "fence"): the job's key,
    ``lease_id = :mine AND state = 'RUNNING'``, and with ``prefix`` = (``batches``,
    ``last_sha256``) the confirmed prefix the write builds on. Values or bind parameters."""
    cond = [_key(ns_id, job_id), J.c.lease_id == lease_id, J.c.state == JobState.RUNNING.value]
    if prefix is not None:
        batches, tail = prefix
        cond += [J.c.batches == batches, J.c.last_sha256 == tail]
    return cond


def _fence(c: Claim, *, on_chain: bool = False) -> list[Any]:
    """:func:`lease_fence` of claim ``c`` (``on_chain``: and of the prefix its job row holds)."""
    prefix = (c.job.batches, c.job.last_sha256) if on_chain else None
    return lease_fence(c.job.namespace_id, c.job.id, c.lease_id, prefix=prefix)


def confirm(
    bind: Bind,
    c: Claim,
    *,
    is_batch: bool,
    roots: int,
    size: int,
    sha256: str,
    after: After,
    lease_seconds: int,
    clock: Clock = DB_CLOCK,
    generation: int | None = None,
) -> Claim | None:
    """Confirm one durably written file, fenced by the claim and the prefix it extends.

    ``generation`` (with ``chain``): the control generation the claim chain last read; the
    UPDATE also requires it unchanged (a subquery on the one-row generation table, no round
    trip of its own). When only that differs, :class:`ControlsChanged` is raised and nothing
    was written: the caller reads the controls again and confirms with ``chain`` or
    ``release`` (docs/archive-controls.md).

    ``after``: ``keep`` the lease (a final batch, finalize follows), ``chain`` the next claim into
    the same statement (attempts+1, a fresh lease id, ``lease_until`` = clock + lease), or
    ``release`` the job to PENDING (time slice over). One UPDATE; the returned claim's row is
    built in Python. Returns the chained claim for ``chain``, the same claim (with the new
    counters) for ``keep``, None for ``release``. Raises :class:`LeaseLost` when the fence
    matches no row.
    """
    job = c.job
    after = After(after)
    confirmed = replace(
        job,
        batches=job.batches + (1 if is_batch else 0),
        roots=job.roots + roots,
        bytes=job.bytes + size,
        last_sha256=sha256,
        attempts=job.attempts + (1 if after is After.CHAIN else 0),
        revision=job.revision + 1,
    )
    guarded = confirm_guard(after, generation, NO_GENERATION)
    if clock is DB_CLOCK:
        stmt = _confirm_statement(after, lease_seconds, guarded)
    else:  # a test clock: its instant is a literal of this one statement
        stmt = _confirm_update(after, lease_seconds, clock, guarded)
    return _apply_confirm(bind, c, stmt, confirmed, after, guarded, generation)


def _apply_confirm(
    bind: Bind,
    c: Claim,
    stmt: Any,
    confirmed: Job,
    after: After,
    guarded: Guard,
    generation: int | None,
    **extra: Any,
) -> Claim | None:
    """Run a confirm UPDATE (:func:`confirm`, :func:`confirm_files`) whose row will be
    ``confirmed``: the fence, the control guard, and the claim that follows (chained, kept or
    none)."""
    job = c.job
    params = dict(
        w_ns=job.namespace_id, w_id=job.id, w_lease=c.lease_id, w_batches=job.batches,
        w_tail=job.last_sha256, v_batches=confirmed.batches, v_roots=confirmed.roots,
        v_bytes=confirmed.bytes, v_sha=confirmed.last_sha256, **extra,
    )  # fmt: skip
    new_lease = random_id() if after is After.CHAIN else None
    if new_lease is not None:
        params["v_lease"] = new_lease
    if guarded is Guard.ROW:
        params["w_gen"] = generation
    with _transaction(bind) as conn:
        if conn.execute(stmt, params).rowcount != 1:
            if guarded and _fence_holds(conn, c):
                raise ControlsChanged(f"job {job.id.hex()}: the controls changed")
            raise LeaseLost(f"job {job.id.hex()}: confirm rejected, lease lost")
    if new_lease is not None:
        return Claim(replace(confirmed, lease_id=new_lease), new_lease, False, c.claimed_at)
    if after is After.KEEP:
        return Claim(confirmed, c.lease_id, False, c.claimed_at)
    return None


class ControlsChanged(Exception):
    """A chained confirm found the control generation changed (its fence held): nothing was
    written; read the controls again and confirm anew."""


def _fence_holds(conn: Connection, c: Claim) -> bool:
    row = conn.execute(select(J.c.id).where(*_fence(c, on_chain=True))).first()
    return row is not None


def _confirm_update(
    after: After, lease_seconds: int, clock: Clock, guarded: Guard = Guard.NONE
) -> Any:
    """The fenced confirm of one file (``lease_id``, RUNNING, the confirmed ``batches`` and
    ``last_sha256`` it extends) with the clock inside the statement; parameters ``w_*`` (the
    fence) and ``v_*`` (the new counters, the chained lease id)."""
    values: dict[str, Any] = dict(
        batches=bindparam("v_batches"),
        roots=bindparam("v_roots"),
        bytes=bindparam("v_bytes"),
        last_sha256=bindparam("v_sha"),
        revision=J.c.revision + 1,
        updated_at=clock.sql(),
    )
    if after is After.CHAIN:
        values.update(
            attempts=J.c.attempts + 1,
            lease_id=bindparam("v_lease"),
            lease_until=clock.sql(lease_seconds),
        )
    elif after is After.RELEASE:
        values.update(state=JobState.PENDING.value, lease_id=None, lease_until=None)
    cond = lease_fence(
        bindparam("w_ns"), bindparam("w_id"), bindparam("w_lease"),
        prefix=(bindparam("w_batches"), bindparam("w_tail")),
    )  # fmt: skip
    if guarded is Guard.ROW:
        cond.append(bindparam("w_gen") == GENERATION_SQL)
    elif guarded is Guard.NO_ROW:
        cond.append(NO_GENERATION_SQL)
    return update(J).where(*cond).values(**values)


@functools.cache
def _confirm_statement(after: After, lease_seconds: int, guarded: Guard = Guard.NONE) -> Any:
    """:func:`_confirm_update` with the database clock, built once per shape: building an
    UPDATE and its cache key costs about ten times the statement's own round trip."""
    return _confirm_update(after, lease_seconds, DB_CLOCK, guarded)


@dataclass(frozen=True, kw_only=True)
class WrittenFile:
    """One durably written file of a group confirm (:func:`confirm_files`)."""

    is_batch: bool
    roots: int
    size: int
    sha256: str


def confirm_files(
    bind: Bind,
    c: Claim,
    files: Sequence[WrittenFile],
    *,
    after: After,
    lease_seconds: int,
    clock: Clock = DB_CLOCK,
    generation: int | None = None,
) -> Claim | None:
    """Group durability: confirm several durably written files -- the next chain positions
    after the confirmed prefix, in order -- in ONE fenced UPDATE, as if each file but the last
    had been confirmed by :func:`confirm` with ``chain`` and the last with ``after``: ``batches``
    and ``attempts`` grow by the files each chained (``attempts == batches + 1`` stays true of a
    healthy job), ``roots`` and ``bytes`` by their sums, ``last_sha256`` is the last file's.
    The fence, ``generation``, ``after`` and the result are :func:`confirm`'s; one file is
    :func:`confirm` itself."""
    assert files, "a group confirm needs a file"
    if len(files) == 1:
        f = files[0]
        return confirm(
            bind, c, is_batch=f.is_batch, roots=f.roots, size=f.size, sha256=f.sha256,
            after=after, lease_seconds=lease_seconds, clock=clock, generation=generation,
        )  # fmt: skip
    job = c.job
    after = After(after)
    more = len(files) - 1 + (1 if after == After.CHAIN else 0)  # the claims the files chained
    confirmed = replace(
        job,
        batches=job.batches + sum(1 for f in files if f.is_batch),
        roots=job.roots + sum(f.roots for f in files),
        bytes=job.bytes + sum(f.size for f in files),
        last_sha256=files[-1].sha256,
        attempts=job.attempts + more,
        revision=job.revision + 1,
    )
    guarded = confirm_guard(after, generation, NO_GENERATION)
    if clock is DB_CLOCK:
        stmt = _group_statement(after, lease_seconds, guarded)
    else:  # a test clock: its instant is a literal of this one statement
        stmt = _group_update(after, lease_seconds, clock, guarded)
    return _apply_confirm(bind, c, stmt, confirmed, after, guarded, generation, v_more=more)


def _group_update(
    after: After, lease_seconds: int, clock: Clock, guarded: Guard = Guard.NONE
) -> Any:
    """:func:`_confirm_update` whose ``attempts`` grow by ``v_more`` (the claims a group of
    files chained)."""
    stmt = _confirm_update(after, lease_seconds, clock, guarded)
    return stmt.values(attempts=J.c.attempts + bindparam("v_more"))


@functools.cache
def _group_statement(after: After, lease_seconds: int, guarded: Guard = Guard.NONE) -> Any:
    """:func:`_group_update` with the database clock, built once per shape."""
    return _group_update(after, lease_seconds, DB_CLOCK, guarded)


def _fenced_update(
    conn: Connection, c: Claim, clock: Clock, what: str, *, on_chain: bool, **values: Any
) -> None:
    """One write of claim ``c``: ``WHERE lease_id = :mine AND state = 'RUNNING'`` (and, with
    ``on_chain``, the confirmed ``batches``/``last_sha256`` it builds on); bumps the revision."""
    result = conn.execute(
        update(J)
        .where(*_fence(c, on_chain=on_chain))
        .values(**values, revision=J.c.revision + 1, updated_at=clock.sql())
    )
    if result.rowcount != 1:
        raise LeaseLost(f"job {c.job.id.hex()}: {what} rejected, lease lost")


def check_lease(bind: Bind, c: Claim, *, clock: Clock = DB_CLOCK) -> None:
    """Raise :class:`LeaseLost` unless claim ``c`` still holds a live lease on the prefix it
    builds on (``lease_id``, RUNNING, ``batches``/``last_sha256``, ``lease_until >= now``: a lease
    is expired only strictly after its end, as for a takeover).

    Called right before files are removed: a claim whose lease expired while it was paused must
    not take the new owner's confirmed files for leftovers."""
    with _transaction(bind) as conn:
        row = conn.execute(
            select(J.c.id).where(*_fence(c, on_chain=True), J.c.lease_until >= clock.sql())
        ).first()
    if row is None:
        raise LeaseLost(f"job {c.job.id.hex()}: lease lost before removing leftovers")


def release(bind: Bind, c: Claim, *, clock: Clock = DB_CLOCK, count_attempt: bool = True) -> None:
    """Give the job back to PENDING (lease cleared) without confirming anything. Without
    ``count_attempt`` the claim's attempt is taken back (``attempts - 1``): a release to wait
    (``replica_diverged``) is no stall, and the stall guard counts claims that confirmed
    nothing."""
    extra = {} if count_attempt else {"attempts": J.c.attempts - 1}
    with _transaction(bind) as conn:
        _fenced_update(
            conn, c, clock, "release", on_chain=False,
            state=JobState.PENDING.value, lease_id=None, lease_until=None, **extra,
        )  # fmt: skip


def fail(bind: Bind, c: Claim, code: ErrorCode, *, clock: Clock = DB_CLOCK) -> None:
    """FAILED with ``code`` (lease cleared), fenced. The plan keeps ``active_job_id``."""
    with _transaction(bind) as conn:
        _fenced_update(
            conn, c, clock, "fail", on_chain=False,
            state=JobState.FAILED.value, error_code=code.value, lease_id=None, lease_until=None,
        )  # fmt: skip


def expire_lost_lease(
    bind: Bind, ns_id: bytes, job_id: bytes, lease_id: bytes, *, clock: Clock = DB_CLOCK
) -> Job | None:
    """Expire the lease of a claim whose process is known dead (a pool child lost by its
    worker's main process, docs/archive-jobs.md "A dead pool child"): ``lease_until`` set one
    second before the clock, by compare-and-set on that claim's own ``lease_id`` while RUNNING
    with a live lease. A claim that moved on (chained, released, finished, taken over) has
    another lease id or state: nothing matches and None is returned. The job stays RUNNING with
    its ``attempts``, so the next claim is a takeover (whole-chain verify, leftovers removed,
    the stall guard counts it), exactly as after the lease ran out by itself; ``revision`` and
    ``updated_at`` are not touched (no claim, confirm or operator change). Returns the job as
    it is after the write."""
    with _transaction(bind) as conn:
        result = conn.execute(
            update(J)
            .where(*lease_fence(ns_id, job_id, lease_id), J.c.lease_until >= clock.sql())
            .values(lease_until=clock.sql(-1))
        )
        if result.rowcount != 1:
            return None
        return get_job(conn, ns_id, job_id)


def _clear_plan(conn: Connection, job: Job, next_job: bytes | None = None) -> int:
    """The plan's ``active_job_id`` from ``job`` to ``next_job`` (None: cleared), only if it
    still points at ``job``; returns the rows changed."""
    result = conn.execute(
        update(archive_plans)
        .where(
            archive_plans.c.namespace_id == job.namespace_id,
            archive_plans.c.kind == job.kind,
            archive_plans.c.active_job_id == job.id,
        )
        .values(active_job_id=next_job)
    )
    return int(result.rowcount)


def finalize(
    bind: Bind, c: Claim, *, clock: Clock = DB_CLOCK, catch_up: bool = False
) -> bytes | None:
    """SUCCEEDED with the lease cleared and the plan's ``active_job_id`` cleared (if it still
    points at this job), in one transaction, fenced by the claim and the confirmed chain.

    ``catch_up``: the job's range was cut to its budget (SPEC §5 catch-up): in the same
    transaction the plan's next job is created, as a due tick would create it now
    (:func:`next_job`), and the plan's ``active_job_id`` points at it; its id is returned (None:
    no job, the plan's active job cleared). ``next_run_at`` is never touched: the plan's phase
    stays where its interval put it.

    The one write of a claim with more than one statement: between them and the ``COMMIT`` it
    holds the job and plan rows (failpoint ``archive.finalize.before_commit``). A holder that
    goes silent there is rolled back by the server's idle-transaction bound
    (db/session_bounds.py)."""
    with _transaction(bind, atomic=True) as conn:
        _fenced_update(
            conn, c, clock, "finalize", on_chain=True,
            state=JobState.SUCCEEDED.value, lease_id=None, lease_until=None,
        )  # fmt: skip
        created = next_job(conn, c.job, clock) if catch_up else None
        if created is None:
            _clear_plan(conn, c.job)
        conn.execute(delete(job_checks).where(_checks_key(c.job)))
        failpoints.hit("archive.finalize.before_commit")
    return created


def next_job(conn: Connection, job: Job, clock: Clock) -> bytes | None:
    """The catch-up job after ``job`` (SPEC §5): when the plan still points at ``job`` and a
    due tick would create a job now (enabled, namespace active, policy confirmed: the tick's own
    :func:`~orbit_tasks.archive.plans.tick_action`), insert the PENDING job a tick inserts
    (:func:`~orbit_tasks.archive.store.plans.new_job_row`) and point the plan at it. Else
    None: the plan's interval (or the operator) takes it from there."""
    plan_row = conn.execute(
        select(archive_plans)
        .where(archive_plans.c.namespace_id == job.namespace_id, archive_plans.c.kind == job.kind)
        .with_for_update()
    ).first()
    if plan_row is None:
        return None
    plan = plan_store.plan_from_row(plan_row)
    if plan.active_job_id != job.id:
        return None
    now = clock.now(conn)
    states = plan_store.namespace_states_shared(conn, [job.namespace_id])
    latest = plan_store.latest_policy_revisions(conn, [(job.namespace_id, job.kind)])
    action = plan_rules.tick_action(
        enabled=plan.enabled,
        next_run_at=now,
        now=now,
        namespace_active=plan_rules.namespace_active(states.get(job.namespace_id)),
        policy_revision=plan.policy_revision,
        latest_policy_revision=latest.get((job.namespace_id, job.kind)),
        active_job_id=None,
    )
    if action is not plan_rules.TickAction.CREATE_JOB:
        return None
    job_id = new_id()
    conn.execute(insert(J), [plan_store.new_job_row(plan, job_id, now)])
    if _clear_plan(conn, job, job_id) != 1:  # cannot happen under the row lock; no stray job
        raise StaleRevision(f"plan {job.kind!r} changed under the catch-up of {job.id.hex()}")
    return job_id


# --- the recorded end of a range (SPEC §5 budget-sized ranges) ------------------------------------


@dataclass(frozen=True)
class RecordedEnd:
    """A row of ``orbit_archive_job_ends``: the effective end of a job's range and why."""

    end: Bound
    policy_until: datetime
    roots_total: int
    sample_roots: int
    sample_bytes: int

    @property
    def cut(self) -> bool:
        return cut_short(self.end, self.policy_until)


def recorded_end(conn: Connection, ns_id: bytes, job_id: bytes) -> RecordedEnd | None:
    row = conn.execute(select(E).where(E.c.namespace_id == ns_id, E.c.job_id == job_id)).first()
    if row is None:
        return None
    until_id = None if row.until_id is None else bytes(row.until_id)
    return RecordedEnd(
        (row.range_until, until_id), row.policy_until, int(row.roots_total),
        int(row.sample_roots), int(row.sample_bytes),
    )  # fmt: skip


def record_end(bind: Bind, c: Claim, end: RecordedEnd, *, clock: Clock = DB_CLOCK) -> None:
    """Record the job's effective end, fenced by the claim: one ``INSERT ... SELECT`` that
    finds the job row only while this claim holds it (``lease_id``, RUNNING, no manifest yet).
    Raises :class:`LeaseLost` when it matched no row. Written before the manifest that names
    the end: a later claim of the job reads it and never cuts again."""
    job = c.job
    values = [
        literal(job.namespace_id, E.c.namespace_id.type).label("namespace_id"),
        literal(job.id, E.c.job_id.type).label("job_id"),
        literal(end.end[0], E.c.range_until.type).label("range_until"),
        literal(end.end[1], E.c.until_id.type).label("until_id"),
        literal(end.policy_until, E.c.policy_until.type).label("policy_until"),
        literal(end.roots_total, E.c.roots_total.type).label("roots_total"),
        literal(end.sample_roots, E.c.sample_roots.type).label("sample_roots"),
        literal(end.sample_bytes, E.c.sample_bytes.type).label("sample_bytes"),
        clock.sql().label("recorded_at"),
    ]
    source_row = select(*values).where(*_fence(c), J.c.last_sha256 == "")
    with _transaction(bind) as conn:
        result = conn.execute(insert(E).from_select([v.name for v in values], source_row))
        if result.rowcount != 1:
            raise LeaseLost(f"job {job.id.hex()}: recording its end rejected, lease lost")


# --- the final step's progress (issue 24 item 4) --------------------------------------------------


def _checks_key(job: Job) -> Any:
    return and_(job_checks.c.namespace_id == job.namespace_id, job_checks.c.job_id == job.id)


def final_progress(bind: Bind, job: Job) -> ChainProgress | None:
    """How far an earlier claim's final step re-verified ``job``'s confirmed chain (None: not
    at all, or a progress of another chain)."""
    with _transaction(bind) as conn:
        row = conn.execute(
            select(job_checks).where(
                _checks_key(job),
                job_checks.c.batches == job.batches,
                job_checks.c.last_sha256 == job.last_sha256,
            )
        ).first()
    if row is None:
        return None
    last = (str(row.last_settled), str(row.last_id)) if row.last_settled else None
    return ChainProgress(
        int(row.checked), str(row.link), int(row.roots), int(row.bytes), last,
        str(row.manifest_sha256),
    )  # fmt: skip


def release_with_progress(
    bind: Bind, c: Claim, progress: ChainProgress, *, clock: Clock = DB_CLOCK
) -> None:
    """The final step's time is up: PENDING again (lease cleared) with its progress recorded,
    in one transaction fenced by the claim and the confirmed chain (``LeaseLost``: neither)."""
    job = c.job
    last_settled, last_id = progress.last or ("", "")
    with _transaction(bind, atomic=True) as conn:
        _fenced_update(
            conn, c, clock, "release", on_chain=True,
            state=JobState.PENDING.value, lease_id=None, lease_until=None,
        )  # fmt: skip
        conn.execute(delete(job_checks).where(_checks_key(job)))
        conn.execute(
            insert(job_checks).values(
                namespace_id=job.namespace_id, job_id=job.id, batches=job.batches,
                last_sha256=job.last_sha256, checked=progress.checked, link=progress.link,
                roots=progress.roots, bytes=progress.bytes, last_settled=last_settled,
                last_id=last_id, manifest_sha256=progress.manifest_sha256,
                updated_at=clock.sql(),
            )
        )  # fmt: skip


# --- manual operations ---------------------------------------------------------------------------


def retry(
    engine: Engine,
    ns_id: bytes,
    job_id: bytes,
    *,
    actor: str,
    max_bytes: int | None = None,
    expect_revision: int | None = None,
    clock: Clock = DB_CLOCK,
) -> Job:
    """FAILED -> PENDING, error_code cleared, optionally a higher ``max_bytes``; audited."""
    with engine.begin() as conn:
        job = require_job(conn, ns_id, job_id)
        check_expected_revision(job.revision, expect_revision)
        new_max = check_retry(job.state, job.max_bytes, max_bytes)
        now = clock.now(conn)
        result = conn.execute(
            update(J)
            .where(*_as_seen(job, now))
            .values(
                state=JobState.PENDING.value,
                error_code="",
                max_bytes=new_max,
                revision=J.c.revision + 1,
                updated_at=now,
            )
        )
        if result.rowcount != 1:
            raise StaleRevision(f"job {job_id.hex()} changed concurrently; read it again")
        insert_audit(
            conn,
            ns_id,
            actor=actor,
            action="archive.job.retry",
            target_kind="archive_job",
            target_id=job_id.hex(),
            detail={
                "from_state": job.state.value,
                "error_code": job.error_code,
                "max_bytes": new_max,
                "previous_max_bytes": job.max_bytes,
                "revision": job.revision + 1,
            },
            at=now,
        )
        return require_job(conn, ns_id, job_id)


def abandon(
    engine: Engine,
    ns_id: bytes,
    job_id: bytes,
    *,
    actor: str,
    expect_revision: int | None = None,
    clock: Clock = DB_CLOCK,
) -> Job:
    """FAILED / PENDING / expired RUNNING -> ABANDONED; clears the plan's active job; audited.
    Files stay on the volume. Whether a RUNNING lease has expired is decided on ``clock.now``
    and the compare-and-set repeats ``lease_until < now`` with that same value."""
    with engine.begin() as conn:
        job = require_job(conn, ns_id, job_id)
        check_expected_revision(job.revision, expect_revision)
        now = clock.now(conn)
        check_abandon(job.state, job.lease_until, now)
        cond = _as_seen(job, now)
        result = conn.execute(
            update(J)
            .where(*cond)
            .values(
                state=JobState.ABANDONED.value,
                lease_id=None,
                lease_until=None,
                revision=J.c.revision + 1,
                updated_at=now,
            )
        )
        if result.rowcount != 1:
            raise StaleRevision(f"job {job_id.hex()} changed concurrently; read it again")
        _clear_plan(conn, job)
        insert_audit(
            conn,
            ns_id,
            actor=actor,
            action="archive.job.abandon",
            target_kind="archive_job",
            target_id=job_id.hex(),
            detail={
                "from_state": job.state.value,
                "error_code": job.error_code,
                "revision": job.revision + 1,
            },
            at=now,
        )
        return require_job(conn, ns_id, job_id)


def record_repair(
    engine: Engine,
    ns_id: bytes,
    job_id: bytes,
    *,
    actor: str,
    detail: dict[str, Any],
    clock: Clock = DB_CLOCK,
) -> None:
    """The audit row of an ``orbit job repair`` that found damaged files (the job row itself
    does not change: the files are put back under the names it already vouches for)."""
    with engine.begin() as conn:
        insert_audit(
            conn, ns_id, actor=actor, action="archive.job.repair", target_kind="archive_job",
            target_id=job_id.hex(), detail=detail, at=clock.now(conn),
        )  # fmt: skip


# --- listing -------------------------------------------------------------------------------------


def encode_cursor(created_at: datetime, job_id: bytes) -> str:
    raw = json.dumps([created_at.isoformat(), job_id.hex()]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, bytes]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ts, hex_id = json.loads(raw)
        return datetime.fromisoformat(ts), bytes.fromhex(hex_id)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(
            f"{{after}} {cursor!r} is not a cursor printed by {{command}} ({type(exc).__name__})",
            fields=("after",),
            command=Command.JOB_LIST,
        ) from None


def list_jobs(
    conn: Connection,
    ns_id: bytes,
    *,
    state: JobState | None = None,
    limit: int = 50,
    after: str | None = None,
) -> tuple[list[Job], str | None]:
    """Jobs of a namespace oldest first (keyset on ix_archive_job_list); returns the next cursor."""
    if not 1 <= limit <= 1000:
        raise InvalidInput(
            f"{{limit}} {limit} is out of range (allowed 1..1000)", fields=("limit",)
        )
    q = select(J).where(J.c.namespace_id == ns_id)
    if state is not None:
        q = q.where(J.c.state == state.value)
    if after is not None:
        c_at, c_id = decode_cursor(after)
        q = q.where(or_(J.c.created_at > c_at, and_(J.c.created_at == c_at, J.c.id > c_id)))
    rows = conn.execute(q.order_by(J.c.created_at, J.c.id).limit(limit + 1)).all()
    jobs = [Job.from_row(r) for r in rows[:limit]]
    nxt = encode_cursor(jobs[-1].created_at, jobs[-1].id) if len(rows) > limit else None
    return jobs, nxt


# --- fixed range and source reads (read-only) ----------------------------------------------------


def job_range(conn: Connection, job: Job) -> ArchiveRange:
    """The job's fixed range, recomputed from database rows (SPEC §5): ``from`` is the greatest
    ``until`` among all SUCCEEDED jobs of (namespace, kind) created before this one, whatever
    their storage, each with its own policy revision.

    Two statements: the latest-created earlier success per policy revision (the greatest
    ``until`` of one revision belongs to its latest job), then those policy rows. Raises
    ``JobFailure(POLICY_MISSING)`` when a policy revision row it needs is gone.
    """
    return range_at(conn, job.namespace_id, job.kind, job.policy_revision, job.created_at, job.id)


def range_at(
    conn: Connection,
    ns_id: bytes,
    kind: str,
    policy_revision: int,
    created_at: datetime,
    job_id: bytes,
) -> ArchiveRange:
    """:func:`job_range` of a job with these fields, whether it exists or not (``orbit plan
    preview``: the job a tick would create now). A job's own recorded end replaces its policy's
    ``until``; the earlier successes count with their recorded end, or (jobs from before
    revision p0006) with their policy's ``until``."""
    inputs, _own = _range_inputs(conn, ns_id, kind, policy_revision, created_at, job_id)
    return derive_range(inputs)


@dataclass(frozen=True)
class ChainRange:
    """What a claim chain knows of its job's range: the range (with the recorded end, if any),
    the end its policy gives, and the recorded end (None: not fixed yet)."""

    range: ArchiveRange
    policy_until: datetime
    recorded: RecordedEnd | None


def chain_range(conn: Connection, job: Job) -> ChainRange:
    """:func:`job_range` with the policy's end and the recorded end, read by the same
    statements (the runner, once per chain)."""
    inputs, own = _range_inputs(
        conn, job.namespace_id, job.kind, job.policy_revision, job.created_at, job.id
    )
    policy_until = range_until(inputs.created_at, inputs.archive_after_seconds)
    return ChainRange(derive_range(inputs), policy_until, own)


def _range_inputs(
    conn: Connection,
    ns_id: bytes,
    kind: str,
    policy_revision: int,
    created_at: datetime,
    job_id: bytes,
) -> tuple[RangeInputs, RecordedEnd | None]:
    earlier = conn.execute(earlier_successes_before(ns_id, kind, created_at, job_id)).all()
    latest = {int(rev): created for rev, created in earlier}
    after = policy_seconds(conn, ns_id, kind, {policy_revision, *latest})
    end_row = conn.execute(earlier_end_before(ns_id, kind, created_at, job_id)).first()
    earlier_end = None if end_row is None else _bound(end_row[0], end_row[1])
    own = recorded_end(conn, ns_id, job_id)
    inputs = RangeInputs(
        created_at,
        after[policy_revision],
        tuple(EarlierSuccess(created, after[rev]) for rev, created in latest.items()),
        earlier_end,
        None if own is None else own.end,
    )
    return inputs, own


def _bound(at: datetime, root_id: bytes | None) -> Bound:
    return at, None if root_id is None else bytes(root_id)


def _earlier(ns_id: bytes, kind: str, created_at: datetime, job_id: bytes) -> list[Any]:
    """The SUCCEEDED jobs of (namespace, kind) created before the job
    (``created_at < :c OR (created_at = :c AND id < :id)``, ix_archive_job_list)."""
    return [
        J.c.namespace_id == ns_id,
        J.c.kind == kind,
        J.c.state == JobState.SUCCEEDED.value,
        or_(J.c.created_at < created_at, and_(J.c.created_at == created_at, J.c.id < job_id)),
    ]


def earlier_end_before(ns_id: bytes, kind: str, created_at: datetime, job_id: bytes) -> Any:
    """The greatest recorded end (range_until, until_id) among the earlier successes (a plain
    time, NULL id, sorts before every key at that time: NULL is the smallest value)."""
    on = and_(E.c.namespace_id == J.c.namespace_id, E.c.job_id == J.c.id)
    return (
        select(E.c.range_until, E.c.until_id)
        .select_from(J.join(E, on))
        .where(*_earlier(ns_id, kind, created_at, job_id))
        .order_by(E.c.range_until.desc(), E.c.until_id.desc())
        .limit(1)
    )


def earlier_successes_query(job: Job) -> Any:
    """(policy_revision, latest created_at) of the SUCCEEDED jobs of (namespace, kind) created
    before ``job`` (``created_at < :c OR (created_at = :c AND id < :id)``, ix_archive_job_list)."""
    return earlier_successes_before(job.namespace_id, job.kind, job.created_at, job.id)


def earlier_successes_before(ns_id: bytes, kind: str, created_at: datetime, job_id: bytes) -> Any:
    """:func:`earlier_successes_query` of a job with these fields: the earlier successes that
    have no recorded end (their end is their policy's ``until``)."""
    recorded = select(E.c.job_id).where(E.c.namespace_id == J.c.namespace_id, E.c.job_id == J.c.id)
    return (
        select(J.c.policy_revision, func.max(J.c.created_at))
        .where(*_earlier(ns_id, kind, created_at, job_id), ~recorded.exists())
        .group_by(J.c.policy_revision)
    )


def policy_seconds(
    conn: Connection, ns_id: bytes, kind: str, revisions: set[int]
) -> dict[int, int]:
    """``archive_after_seconds`` of the given policy revisions; POLICY_MISSING if one is gone."""
    rows = conn.execute(
        select(archive_policies.c.revision, archive_policies.c.archive_after_seconds).where(
            archive_policies.c.namespace_id == ns_id,
            archive_policies.c.kind == kind,
            archive_policies.c.revision.in_(sorted(revisions)),
        )
    ).all()
    found = {int(rev): int(seconds) for rev, seconds in rows}
    if set(found) != revisions:
        raise JobFailure(ErrorCode.POLICY_MISSING)
    return found
