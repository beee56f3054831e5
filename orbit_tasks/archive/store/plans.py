"""Every SQL statement on archive plans, the job creation of a tick and the sweep query.

Functions take a ``Connection`` inside the caller's transaction and receive ``now`` from the
caller (the tick's clock seam, docs/archive-plans.md); none reads the time itself. Operator
changes (``set_plan``) bump ``revision`` and ``updated_at``; ticks only ever touch
``next_run_at`` and ``active_job_id``, by compare-and-set on the values the tick saw, a page of
plans per statement (``write_tick``; fewer rows matched than written -> TickConflict).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import (
    Boolean,
    Connection,
    Select,
    TextClause,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from orbit_tasks.archive import plans
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.engine import Clock, is_mysql
from orbit_tasks.db.platform_tables import (
    archive_jobs,
    archive_plans,
    archive_policies,
    heartbeat,
    namespaces,
)
from orbit_tasks.errors import NotFound, StaleRevision
from orbit_tasks.platform.store import (
    RetiredKind,
    insert_audit,
    latest_policy,
    retirement,
    storage_exists,
)

P = archive_plans.c
J = archive_jobs.c
Plan = plans.Plan  # the plan as a value (archive.plans), as the store's callers name it
_stamp = plans.stamp


@dataclass(frozen=True)
class SetPlanResult:
    plan: Plan
    created: bool
    changed: bool  # False: same values as before, nothing written (no revision bump)


def plan_from_row(row: Any) -> Plan:
    """A plan row as read (``select(archive_plans)``)."""
    return Plan(
        namespace_id=bytes(row.namespace_id),
        kind=row.kind,
        revision=int(row.revision),
        enabled=bool(row.enabled),
        policy_revision=int(row.policy_revision),
        storage_id=bytes(row.storage_id),
        interval_seconds=int(row.interval_seconds),
        batch_size=int(row.batch_size),
        max_bytes=int(row.max_bytes),
        next_run_at=row.next_run_at,
        active_job_id=None if row.active_job_id is None else bytes(row.active_job_id),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def get_plan(conn: Connection, ns_id: bytes, kind: str) -> Plan | None:
    row = conn.execute(select(archive_plans).where(P.namespace_id == ns_id, P.kind == kind)).first()
    return None if row is None else plan_from_row(row)


def list_plans(conn: Connection, ns_id: bytes | None = None) -> list[Plan]:
    query = select(archive_plans).order_by(P.namespace_id, P.kind)
    if ns_id is not None:
        query = query.where(P.namespace_id == ns_id)
    return [plan_from_row(r) for r in conn.execute(query).all()]


def latest_policy_revision(conn: Connection, ns_id: bytes, kind: str) -> int | None:
    policy = latest_policy(conn, ns_id, kind)
    return None if policy is None else policy.revision


def namespace_state_shared(conn: Connection, ns_id: bytes) -> str | None:
    """The namespace's state, read with a shared lock (MySQL ``LOCK IN SHARE MODE``) so that a
    concurrent disable cannot commit between this check and the write it guards."""
    return namespace_states_shared(conn, [ns_id]).get(ns_id)


# --- operator changes ---------------------------------------------------------------------------


def set_plan(
    conn: Connection,
    ns_id: bytes,
    kind: str,
    *,
    storage_id: bytes | None,
    interval: int | None,
    batch_size: int | None,
    max_bytes: int | None,
    policy_revision: int | None,
    enabled: bool | None,
    expect_revision: int | None,
    now: dt.datetime,
    actor: str,
) -> SetPlanResult:
    """Create or update the plan of (namespace, kind) inside the caller's transaction.

    On create every config value is required and ``enabled`` defaults to False (seed default);
    ``expect_revision`` must be absent or 0 ("must not exist yet"). On update, None keeps the
    current value. A change bumps ``revision`` and ``updated_at`` and writes an audit row; a
    change to identical values writes nothing. Raises InvalidInput / NotFound / IllegalState /
    StaleRevision before anything is written. The store reads the facts (the namespace's state,
    the current plan, whether the storage is registered, the latest policy revision); the
    decisions are the rules of :mod:`orbit_tasks.archive.plans`.
    """
    plans.validate_kind(kind)
    plans.check_expect_revision(expect_revision)
    plans.check_namespace(ns_id, namespace_state_shared(conn, ns_id))
    current = get_plan(conn, ns_id, kind)
    change = plans.PlanChange(
        storage_id=storage_id,
        interval_seconds=interval,
        batch_size=batch_size,
        max_bytes=max_bytes,
        policy_revision=policy_revision,
        enabled=enabled,
        expect_revision=expect_revision,
    )
    values = plans.merge_change(kind, current, change)
    plans.check_references(
        kind,
        values,
        storage_registered=storage_exists(conn, values.storage_id),
        latest_policy_revision=latest_policy_revision(conn, ns_id, kind),
        storage_retired=retirement(conn, RetiredKind.STORAGE, values.storage_id, shared=True)
        is not None,
        storage_before=None if current is None else current.storage_id,
    )
    next_run = plans.next_run_on_change(
        None if current is None else current.enabled,
        values.enabled,
        None if current is None else current.next_run_at,
        now,
    )
    changes = plans.plan_changes(current, values)
    if current is None:
        _insert_plan(conn, ns_id, kind, values, next_run, now)
        revision = 1
    else:
        if not changes:
            return SetPlanResult(current, created=False, changed=False)
        _update_plan(conn, current, values, next_run, now)
        revision = current.revision + 1
    insert_audit(
        conn,
        ns_id,
        actor=actor,
        action="archive.plan.set",
        target_kind="archive_plan",
        target_id=kind,
        detail={"kind": kind, "revision": revision, "created": current is None, "changes": changes},
        at=now,
    )
    plan = get_plan(conn, ns_id, kind)
    assert plan is not None
    return SetPlanResult(plan, created=current is None, changed=True)


def _insert_plan(
    conn: Connection,
    ns_id: bytes,
    kind: str,
    values: plans.PlanValues,
    next_run: dt.datetime | None,
    now: dt.datetime,
) -> None:
    """A new plan at revision 1."""
    try:
        conn.execute(
            insert(archive_plans).values(
                namespace_id=ns_id,
                kind=kind,
                revision=1,
                next_run_at=next_run,
                active_job_id=None,
                created_at=now,
                updated_at=now,
                **values.columns(),
            )
        )
    except IntegrityError:
        raise StaleRevision(f"plan {kind!r} was created concurrently; retry") from None


def _update_plan(
    conn: Connection,
    current: Plan,
    values: plans.PlanValues,
    next_run: dt.datetime | None,
    now: dt.datetime,
) -> None:
    """The plan's new values, compare-and-set on the revision read."""
    # next_run_at is written only when the change moves it (into enabled: due now). Else it
    # stays the tick's column: a tick may have advanced it since ``current`` was read, and
    # the compare-and-set on ``revision`` does not see that (ticks never bump it).
    moved = {} if next_run == current.next_run_at else {"next_run_at": next_run}
    result = conn.execute(
        update(archive_plans)
        .where(
            P.namespace_id == current.namespace_id,
            P.kind == current.kind,
            P.revision == current.revision,
        )
        .values(revision=current.revision + 1, updated_at=now, **moved, **values.columns())
    )
    if result.rowcount != 1:
        raise StaleRevision(f"plan {current.kind!r} changed concurrently; retry")


@dataclass(frozen=True)
class RunPlanResult:
    """What ``orbit plan run`` did: the plan after it, the ``next_run_at`` it had, and the run
    the interval's phase schedules after the job the next tick creates."""

    plan: Plan
    scheduled_before: dt.datetime
    next_scheduled: dt.datetime


def run_plan(
    conn: Connection, ns_id: bytes, kind: str, *, now: dt.datetime, actor: str
) -> RunPlanResult:
    """Make the plan of (namespace, kind) due at ``now``, phase kept (``plans.run_now_at``), with
    one audit row (``archive.plan.run``), inside the caller's transaction. Raises NotFound (no
    namespace or plan) or IllegalState (``plans.run_refusal``: inactive namespace, disabled plan,
    policy unconfirmed, active job) before anything is written. The plan row is read with a
    locking read and written by compare-and-set on what was read, so a tick that created a job
    or an operator change in between is a conflict (StaleRevision), never overwritten. The
    plan's ``revision`` does not change: no configuration changed."""
    plans.validate_kind(kind)
    state = namespace_state_shared(conn, ns_id)
    plans.check_namespace(ns_id, state, active=False)  # an inactive one: the refusal names it
    assert state is not None
    row = conn.execute(
        select(archive_plans).where(P.namespace_id == ns_id, P.kind == kind).with_for_update()
    ).first()
    if row is None:
        raise NotFound(f"namespace {ns_id.hex()} has no {kind!r} plan")
    plan = plan_from_row(row)
    active_state = None
    if plan.active_job_id is not None:
        active_state = conn.execute(
            select(J.state).where(J.namespace_id == ns_id, J.id == plan.active_job_id)
        ).scalar()
    refusal = plans.run_refusal(
        enabled=plan.enabled,
        namespace_state=state,
        policy_revision=plan.policy_revision,
        latest_policy_revision=latest_policy_revision(conn, ns_id, kind),
        active_job_id=plan.active_job_id,
        active_job_state=active_state,
    )
    if refusal is not None:
        raise plans.refuse_run(kind, refusal)
    due_at = plans.run_now_at(plan.next_run_at, plan.interval_seconds, now)
    if due_at != plan.next_run_at:
        result = conn.execute(
            update(archive_plans)
            .where(
                P.namespace_id == ns_id,
                P.kind == kind,
                P.revision == plan.revision,
                P.next_run_at == plan.next_run_at,
                P.enabled == true(),
                P.active_job_id.is_(None),
            )
            .values(next_run_at=due_at)
        )
        if result.rowcount != 1:
            raise StaleRevision(f"plan {kind!r} changed concurrently; retry")
    after = plans.next_after(due_at, plan.interval_seconds, now)
    insert_audit(
        conn,
        ns_id,
        actor=actor,
        action="archive.plan.run",
        target_kind="archive_plan",
        target_id=kind,
        detail={
            "kind": kind,
            "revision": plan.revision,
            "next_run_at": [_stamp(plan.next_run_at), _stamp(due_at)],
            "next_scheduled": _stamp(after),
        },
        at=now,
    )
    current = get_plan(conn, ns_id, kind)
    assert current is not None
    return RunPlanResult(current, plan.next_run_at, after)


def recent_successes(
    conn: Connection, ns_id: bytes, kind: str, limit: int = plans.RATE_JOBS
) -> tuple[int, float]:
    """(roots, seconds) summed over the ``limit`` most recent SUCCEEDED jobs of (namespace, kind)
    that archived roots, each from its creation to its success (``updated_at``), newest first on
    ``ix_archive_job_list`` (namespace_id, created_at, id): the plan's measured rate
    (``plans.rate_of``) includes every per-job cost and wait an operator sees."""
    rows = conn.execute(
        select(J.roots, J.created_at, J.updated_at)
        .where(
            J.namespace_id == ns_id,
            J.kind == kind,
            J.state == JobState.SUCCEEDED.value,
            J.roots > 0,
        )
        .order_by(J.created_at.desc(), J.id.desc())
        .limit(limit)
    ).all()
    roots = sum(int(r.roots) for r in rows)
    seconds = sum((r.updated_at - r.created_at).total_seconds() for r in rows)
    return roots, seconds


# --- ticks (SPEC §4, §7): a bounded number of statements per page of due plans --------------

DueCursor = tuple[dt.datetime, bytes, str]


class TickConflict(Exception):
    """A tick's compare-and-set matched fewer plan rows than it wrote: another tick or an
    operator changed one of them since the tick read it. Rows that did match were updated, so the
    caller must roll the whole transaction back (raising this out of ``engine.begin()`` does)."""


@dataclass(frozen=True)
class TickWrite:
    """What a tick writes to one plan row it saw as ``plan``: the advanced ``next_run_at`` and,
    when the run gets a job, the new job's id (the job row is inserted with the plan's frozen
    fields)."""

    plan: Plan
    next_run_at: dt.datetime
    job_id: bytes | None = None


def due_plans_query(
    storage_id: bytes, now: dt.datetime, limit: int, after: DueCursor | None = None
) -> Select[Any]:
    """The due-plan scan on index
    ``ix_archive_plan_due`` (storage_id, enabled, next_run_at [, PK]). ``after`` is the keyset
    cursor (next_run_at, namespace_id, kind) of the previous page, in the expanded form."""
    cond = [P.storage_id == storage_id, P.enabled == true(), P.next_run_at <= now]
    if after is not None:
        t, ns, kind = after
        cond.append(
            or_(
                P.next_run_at > t,
                and_(
                    P.next_run_at == t,
                    or_(P.namespace_id > ns, and_(P.namespace_id == ns, P.kind > kind)),
                ),
            )
        )
    query = (
        select(archive_plans)
        .where(*cond)
        .order_by(P.next_run_at, P.namespace_id, P.kind)
        .limit(limit)
    )
    return query


def due_plans(
    conn: Connection,
    storage_id: bytes,
    now: dt.datetime,
    limit: int,
    after: DueCursor | None = None,
) -> list[Plan]:
    """Enabled plans of ``storage_id`` with ``next_run_at <= now``, oldest first, on index
    ``ix_archive_plan_due``; ``after`` = the last (next_run_at, namespace_id, kind) seen."""
    return [
        plan_from_row(r) for r in conn.execute(due_plans_query(storage_id, now, limit, after)).all()
    ]


def namespace_states_query(ns_ids: Collection[bytes]) -> Select[Any]:
    """States of the given namespaces on their primary key, with a shared lock (MySQL ``LOCK IN
    SHARE MODE``): a concurrent disable waits until the tick's transaction ends."""
    return (
        select(namespaces.c.id, namespaces.c.state)
        .where(namespaces.c.id.in_(sorted(ns_ids)))
        .with_for_update(read=True)
    )


def namespace_states_shared(conn: Connection, ns_ids: Collection[bytes]) -> dict[bytes, str]:
    """{namespace id: state} for the ids that exist, read with a shared lock (one statement)."""
    if not ns_ids:
        return {}
    return {bytes(r[0]): str(r[1]) for r in conn.execute(namespace_states_query(ns_ids))}


def latest_policies_query(keys: Collection[tuple[bytes, str]]) -> Select[Any]:
    """The latest policy revision of every (namespace, kind) of ``keys``: one grouped read of
    exactly those pairs on the policies' primary key prefix (an IN list of pairs is a set of
    point ranges on MariaDB; this is not a keyset comparison, for which the expanded form rules)."""
    pol = archive_policies.c
    return (
        select(pol.namespace_id, pol.kind, func.max(pol.revision))
        .where(tuple_(pol.namespace_id, pol.kind).in_(sorted(keys)))
        .group_by(pol.namespace_id, pol.kind)
    )


def latest_policy_revisions(
    conn: Connection, keys: Collection[tuple[bytes, str]]
) -> dict[tuple[bytes, str], int]:
    """{(namespace id, kind): latest policy revision} for the pairs of ``keys`` that have one."""
    if not keys:
        return {}
    rows = conn.execute(latest_policies_query(keys))
    return {(bytes(ns), str(kind)): int(revision) for ns, kind, revision in rows}


# One plan slot of the page's compare-and-set UPDATE: the key selects the row in each CASE, and
# the WHERE requires exactly what the tick saw (revision, next_run_at, enabled, no active job
# when it gets one / an active job when the run is coalesced).
_SLOT_KEY = "namespace_id = :ns{i} AND kind = :kind{i}"
_SLOT_NEXT = "WHEN " + _SLOT_KEY + " THEN :next{i}"
_SLOT_JOB = "WHEN " + _SLOT_KEY + " THEN COALESCE(:job{i}, active_job_id)"
_SLOT_CAS = (
    "(" + _SLOT_KEY + " AND revision = :revision{i} AND next_run_at = :seen{i} AND enabled = 1"
    " AND (active_job_id IS NULL) = :no_job{i})"
)


@functools.lru_cache(maxsize=16)
def _tick_update_shape(size: int) -> TextClause:
    """The compare-and-set UPDATE with ``size`` plan slots (a power of two), built and compiled
    once per size per process; a page's values are bound parameters, and unused slots bind NULL,
    which matches no row. Written as text: the same statement from Core expressions took three
    times the CPU to build and compile and twice the bytes on the wire (qualified names)."""
    slots = range(size)
    sql = (
        "UPDATE orbit_archive_plans SET next_run_at = CASE "
        + " ".join(_SLOT_NEXT.format(i=i) for i in slots)
        + " ELSE next_run_at END, active_job_id = CASE "
        + " ".join(_SLOT_JOB.format(i=i) for i in slots)
        + " ELSE active_job_id END WHERE "
        + " OR ".join(_SLOT_CAS.format(i=i) for i in slots)
    )
    types = {
        "ns": P.namespace_id.type,
        "kind": P.kind.type,
        "revision": P.revision.type,
        "seen": P.next_run_at.type,
        "no_job": Boolean(),
        "next": P.next_run_at.type,
        "job": P.active_job_id.type,
    }
    return text(sql).bindparams(
        *(bindparam(f"{name}{i}", type_=type_) for i in slots for name, type_ in types.items())
    )


def tick_update_statement(writes: Sequence[TickWrite]) -> tuple[TextClause, dict[str, Any]]:
    """One compare-and-set UPDATE for every plan of ``writes``, with its parameters: each row
    must still hold exactly what the tick saw (revision, next_run_at, enabled, and no active job
    when it gets one, an active job when the run is coalesced). Only ``next_run_at`` and
    ``active_job_id`` change (a plan without a new job keeps its ``active_job_id``)."""
    size = 1 << (len(writes) - 1).bit_length()  # a few shapes per process, not one per size
    params: dict[str, Any] = {
        f"{name}{i}": None
        for i in range(len(writes), size)
        for name in ("ns", "kind", "revision", "seen", "no_job", "next", "job")
    }
    for i, w in enumerate(writes):
        params[f"ns{i}"] = w.plan.namespace_id
        params[f"kind{i}"] = w.plan.kind
        params[f"revision{i}"] = w.plan.revision
        params[f"seen{i}"] = w.plan.next_run_at
        params[f"no_job{i}"] = w.job_id is not None or w.plan.active_job_id is None
        params[f"next{i}"] = w.next_run_at
        params[f"job{i}"] = w.job_id
    return _tick_update_shape(size), params


def new_job_row(plan: Plan, job_id: bytes, now: dt.datetime) -> dict[str, Any]:
    """The row of the PENDING job a tick creates for ``plan`` at ``now``: the frozen fields
    from the plan as seen, ``created_at = updated_at = now`` (the other columns take their
    defaults)."""
    return dict(
        namespace_id=plan.namespace_id,
        id=job_id,
        kind=plan.kind,
        plan_revision=plan.revision,
        policy_revision=plan.policy_revision,
        storage_id=plan.storage_id,
        batch_size=plan.batch_size,
        max_bytes=plan.max_bytes,
        state=JobState.PENDING.value,
        created_at=now,
        updated_at=now,
    )


def write_tick(conn: Connection, writes: Sequence[TickWrite], now: dt.datetime) -> None:
    """Apply a tick's decisions for a page of plans in two statements: the compare-and-set
    UPDATE of every plan row, then one multi-row INSERT of the new PENDING jobs (frozen fields
    from the plan as seen, ``created_at = updated_at = now``). Raises TickConflict when any
    plan row did not match (the caller rolls back; no job row has been written then)."""
    if not writes:
        return
    statement, params = tick_update_statement(writes)
    result = conn.execute(statement, params)
    if result.rowcount != len(writes):
        raise TickConflict(f"{len(writes) - result.rowcount} of {len(writes)} plans changed")
    jobs = [new_job_row(w.plan, w.job_id, now) for w in writes if w.job_id is not None]
    if jobs:
        conn.execute(insert(archive_jobs), jobs)


# --- the replica heartbeat ---------------------------------------------------------------------

HEARTBEAT_ID = 1  # the table's one row


def write_heartbeat(conn: Connection, clock: Clock) -> None:
    """The tick's beat on the primary (docs/operations.md "Read from a replica"): the one row's
    ``beat_at`` set to the clock inside the statement, created on first use. Written after the
    tick's jobs committed, so every job created before has ``created_at <= beat_at``; a replica
    that shows this beat has applied those jobs' transactions and every write committed before."""
    values = {"id": HEARTBEAT_ID, "beat_at": clock.sql()}
    if is_mysql(conn):
        stmt: Any = mysql_insert(heartbeat).values(values)
        stmt = stmt.on_duplicate_key_update(beat_at=stmt.inserted.beat_at)
    else:
        stmt = sqlite_insert(heartbeat).values(values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[heartbeat.c.id], set_={"beat_at": stmt.excluded.beat_at}
        )
    conn.execute(stmt)


# --- sweep --------------------------------------------------------------------------------------


class SweptJob(NamedTuple):
    namespace_id: bytes
    job_id: bytes
    kind: str  # labels the wake-up (Flower); never routes it


def expired_running_query(
    storage_id: bytes, now: dt.datetime, limit: int, where: Any = None
) -> Select[Any]:
    """RUNNING jobs whose lease expired: ``lease_until < now`` (at ``now == lease_until`` the
    lease still holds, SPEC §5)."""
    q = select(J.namespace_id, J.id, J.kind).where(
        J.storage_id == storage_id, J.state == JobState.RUNNING.value, J.lease_until < now
    )
    if where is not None:
        q = q.where(where)
    return q.order_by(J.lease_until, J.updated_at).limit(limit)


def pending_query(storage_id: bytes, limit: int, where: Any = None) -> Select[Any]:
    # lease_until is NULL for every PENDING row; ordering by it too keeps the index order.
    q = select(J.namespace_id, J.id, J.kind).where(
        J.storage_id == storage_id, J.state == JobState.PENDING.value
    )
    if where is not None:
        q = q.where(where)
    return q.order_by(J.lease_until, J.updated_at).limit(limit)


def sweep(
    conn: Connection, storage_id: bytes, now: dt.datetime, limit: int, where: Any = None
) -> list[SweptJob]:
    """Jobs on ``storage_id`` that need a wake-up: RUNNING jobs whose lease expired (takeover)
    first, then PENDING jobs, oldest first; at most ``limit`` in total. Both queries run on
    ``ix_archive_job_claim``. ``where`` leaves jobs out (those of paused scopes)."""
    if limit <= 0:
        return []
    out = [
        SweptJob(bytes(r[0]), bytes(r[1]), str(r[2]))
        for r in conn.execute(expired_running_query(storage_id, now, limit, where))
    ]
    if len(out) < limit:
        out += [
            SweptJob(bytes(r[0]), bytes(r[1]), str(r[2]))
            for r in conn.execute(pending_query(storage_id, limit - len(out), where))
        ]
    return out
