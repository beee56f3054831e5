"""Every SQL statement on the archive controls (issue 16, docs/archive-controls.md).

Controls (``orbit_archive_controls``) are changed by operators, each change in one transaction
with the generation bump and an ``orbit_audit_events`` row (:func:`change`). Workers read them
before a claim; a running claim's chained confirm compares the generation inside its UPDATE
(``store/jobs.confirm(generation=...)``), so a change is seen at the next batch boundary
without a statement of its own. The throttle's budget (``orbit_archive_throttle_buckets``) is one
instant per scope, compared and set with the database clock (:func:`take_budget`). Waits
(``orbit_archive_job_waits``) are written only when a job waits and when a waiting job is next
claimed. Functions take a ``Connection`` inside the caller's transaction unless they say so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    and_,
    delete,
    func,
    insert,
    literal_column,
    not_,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnClause

from orbit_tasks.archive.controls import (
    Control,
    ControlKind,
    Scope,
    WaitReason,
    Window,
    format_windows,
    in_window,
    scope_keys,
    stored_windows,
)
from orbit_tasks.archive.controls import (
    take_budget as budget_rule,
)
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.engine import DB_CLOCK, Clock, is_mysql
from orbit_tasks.db.platform_tables import archive_controls as C
from orbit_tasks.db.platform_tables import archive_jobs as J
from orbit_tasks.db.platform_tables import control_generation as G
from orbit_tasks.db.platform_tables import job_waits as W
from orbit_tasks.db.platform_tables import throttle_buckets as B
from orbit_tasks.platform.store import insert_audit

#: Audit rows of controls whose scope names no namespace carry this namespace id (no tenant
#: has it: ids are UUIDv7), so a storage-wide or global change is audited once.
PLATFORM_NAMESPACE = bytes(16)
CAS_ATTEMPTS = 20


#: The generation before any control was ever changed: the one-row table has no row yet.
NO_GENERATION = 0


def generation_query() -> Any:
    """The control generation as a scalar subquery (:data:`NO_GENERATION` while no row)."""
    return (
        select(func.coalesce(func.max(G.c.generation), NO_GENERATION))
        .where(G.c.id == 1)
        .scalar_subquery()
    )


#: The chained confirm's guard, one literal SQL fragment each (a prebuilt ``Select`` would cost
#: SQLAlchemy a cache-key walk on every execution of the hot statement): the generation read
#: by primary key (no aggregate: measured 31 us against 67 us for ``COALESCE(MAX(...))`` at the
#: driver), or, while no control was ever changed, that the row is still missing.
GENERATION_SQL: ColumnClause[int] = literal_column(
    f"(SELECT {G.c.generation.name} FROM {G.name} WHERE {G.c.id.name} = 1)"
)
NO_GENERATION_SQL: ColumnClause[bool] = literal_column(
    f"NOT EXISTS (SELECT 1 FROM {G.name} WHERE {G.c.id.name} = 1)"
)


def read_generation(conn: Connection) -> int:
    return int(conn.execute(select(generation_query())).scalar_one())


def _bump_generation(conn: Connection) -> None:
    if conn.execute(update(G).where(G.c.id == 1).values(generation=G.c.generation + 1)).rowcount:
        return
    try:
        conn.execute(insert(G).values(id=1, generation=1))
    except IntegrityError:  # another change inserted it first
        conn.execute(update(G).where(G.c.id == 1).values(generation=G.c.generation + 1))


def _control(row: Any) -> Control:
    return Control(
        kind=ControlKind(row.control),
        scope=Scope(row.storage_id, row.namespace_id, row.kind),
        actor=row.actor,
        since=row.since,
        reason=row.reason,
        max_roots_per_second=row.max_roots_per_second,
        windows=stored_windows(row.windows),
    )


def list_controls(conn: Connection) -> list[Control]:
    rows = conn.execute(select(C).order_by(C.c.control, C.c.scope)).all()
    return [_control(r) for r in rows]


def controls_for(
    conn: Connection, storage_id: bytes, namespace_id: bytes, kind: str
) -> list[Control]:
    """The controls in force for a job on (storage, namespace, kind): point lookups on the key."""
    keys = scope_keys(storage_id, namespace_id, kind)
    rows = conn.execute(select(C).where(C.c.scope.in_(keys))).all()
    return [_control(r) for r in rows]


def pauses(conn: Connection) -> list[Scope]:
    rows = conn.execute(
        select(C.c.storage_id, C.c.namespace_id, C.c.kind).where(
            C.c.control == ControlKind.PAUSE.value
        )
    ).all()
    return [Scope(r.storage_id, r.namespace_id, r.kind) for r in rows]


def pauses_in_force(conn: Connection) -> list[Control]:
    """The pauses in force, oldest first (the exporter's ``orbit_archive_pause_age_seconds``)."""
    rows = conn.execute(
        select(C).where(C.c.control == ControlKind.PAUSE.value).order_by(C.c.since, C.c.scope)
    ).all()
    return [_control(r) for r in rows]


def closed_windows(conn: Connection, now: datetime) -> list[Scope]:
    """The scopes of the window controls that are closed at ``now``: the tick's sweep leaves
    their jobs out like those of paused scopes (they would only wait, and take the wake-ups of
    the jobs that may run)."""
    rows = conn.execute(
        select(C.c.storage_id, C.c.namespace_id, C.c.kind, C.c.windows).where(
            C.c.control == ControlKind.WINDOW.value
        )
    ).all()
    return [
        Scope(r.storage_id, r.namespace_id, r.kind)
        for r in rows
        if not in_window(stored_windows(r.windows), now)
    ]


@dataclass(frozen=True)
class Change:
    """What one operator command does: set (``clear`` False) or clear one control."""

    kind: ControlKind
    scope: Scope
    clear: bool = False
    reason: str = ""
    max_roots_per_second: int | None = None
    windows: tuple[Window, ...] = ()


def change(conn: Connection, ch: Change, *, actor: str, clock: Clock = DB_CLOCK) -> bool:
    """Set or clear one control, bump the generation and audit it, in the caller's transaction.
    Returns False when a clear found nothing (nothing is written then)."""
    now = clock.now(conn)
    key = ch.scope.key
    cond = and_(C.c.control == ch.kind.value, C.c.scope == key)
    previous = conn.execute(select(C).where(cond)).first()
    if ch.clear and previous is None:
        return False
    conn.execute(delete(C).where(cond))
    detail: dict[str, Any] = {"scope": key, "control": ch.kind.value}
    if not ch.clear:
        c = ch
        conn.execute(
            insert(C).values(
                control=ch.kind.value,
                scope=key,
                storage_id=ch.scope.storage_id,
                namespace_id=ch.scope.namespace_id,
                kind=ch.scope.kind,
                max_roots_per_second=c.max_roots_per_second,
                windows=format_windows(c.windows),
                reason=c.reason,
                actor=actor,
                since=now,
            )
        )
        detail |= {
            "max_roots_per_second": c.max_roots_per_second,
            "windows": format_windows(c.windows),
            "reason": c.reason,
        }
    if ch.kind is ControlKind.THROTTLE:
        conn.execute(delete(B).where(B.c.scope == key))  # a new rate starts from an idle budget
    _bump_generation(conn)
    action = f"archive.{ch.kind.value}.{'clear' if ch.clear else 'set'}"
    if ch.kind is ControlKind.PAUSE:
        action = "archive.resume" if ch.clear else "archive.pause"
    insert_audit(
        conn,
        ch.scope.namespace_id or PLATFORM_NAMESPACE,
        actor=actor,
        action=action,
        target_kind="archive_control",
        target_id=key,
        detail=detail,
        at=now,
    )
    return True


# --- the throttle's budget ----------------------------------------------------------------------


def take_budget(
    conn: Connection, scope_key: str, roots: int, rate: int, *, clock: Clock = DB_CLOCK
) -> float:
    """Charge ``roots`` to the scope's shared budget; returns the seconds to wait before going
    on. One read of (``ready_at``, clock) and one compare-and-set per try, each committing by
    itself on the runner's connection."""
    for _ in range(CAS_ATTEMPTS):
        with conn.begin():
            row = conn.execute(
                select(B.c.ready_at, clock.sql().label("now")).where(B.c.scope == scope_key)
            ).first()
            now = row.now if row is not None else clock.now(conn)
            seen = row.ready_at if row is not None else None
            new, wait = budget_rule(seen, now, roots, rate)
            if seen is None:
                try:
                    conn.execute(insert(B).values(scope=scope_key, ready_at=new))
                except IntegrityError:
                    continue
                return wait
            done = conn.execute(
                update(B).where(B.c.scope == scope_key, B.c.ready_at == seen).values(ready_at=new)
            ).rowcount
        if done == 1:
            return wait
    return 0.0  # lost every race to other takers: they pay; go on (bounded by CAS_ATTEMPTS)


def budget_waits(conn: Connection, keys: Sequence[str], *, clock: Clock = DB_CLOCK) -> float:
    """Seconds until every one of these budgets is paid for (read only: before a claim)."""
    if not keys:
        return 0.0
    rows = conn.execute(
        select(B.c.ready_at, clock.sql().label("now")).where(B.c.scope.in_(list(keys)))
    ).all()
    return max([max(0.0, (r.ready_at - r.now).total_seconds()) for r in rows] or [0.0])


# --- the load guard -----------------------------------------------------------------------------


def threads_running(conn: Connection) -> int | None:
    """The server's ``Threads_running`` (MySQL/MariaDB); None on SQLite, which has no such
    figure (the load guard does nothing there)."""
    if not is_mysql(conn):
        return None
    row = conn.execute(text("SHOW GLOBAL STATUS LIKE 'Threads_running'")).first()
    return None if row is None else int(row[1])


# --- waits --------------------------------------------------------------------------------------


def job_waits(
    conn: Connection, ns_id: bytes, job_id: bytes
) -> list[tuple[str, datetime | None, int]]:
    rows = conn.execute(
        select(W.c.reason, W.c.since, W.c.waited_us).where(
            W.c.namespace_id == ns_id, W.c.job_id == job_id
        )
    ).all()
    return [(str(r.reason), r.since, int(r.waited_us)) for r in rows]


def _micros(later: datetime, earlier: datetime) -> int:
    return max(0, round((later - earlier).total_seconds() * 1_000_000))


def record_wait(
    conn: Connection, ns_id: bytes, job_id: bytes, reason: WaitReason, now: datetime
) -> None:
    """The job waits for ``reason`` from ``now`` on (an open wait for another reason ends now;
    one already open for this reason keeps its start)."""
    key = and_(W.c.namespace_id == ns_id, W.c.job_id == job_id)
    rows = job_waits(conn, ns_id, job_id)
    for other, since, waited in rows:
        if other != reason.value and since is not None:
            conn.execute(
                update(W)
                .where(key, W.c.reason == other)
                .values(since=None, waited_us=waited + _micros(now, since), updated_at=now)
            )
    mine = [r for r in rows if r[0] == reason.value]
    if not mine:
        with contextlib.suppress(IntegrityError):  # another worker recorded it first
            conn.execute(
                insert(W).values(
                    namespace_id=ns_id,
                    job_id=job_id,
                    reason=reason.value,
                    since=now,
                    waited_us=0,
                    updated_at=now,
                )  # fmt: skip
            )
    elif mine[0][1] is None:
        conn.execute(
            update(W)
            .where(key, W.c.reason == reason.value, W.c.since.is_(None))
            .values(since=now, updated_at=now)
        )


def close_waits(conn: Connection, ns_id: bytes, job_id: bytes, now: datetime) -> None:
    """The job is claimed again: every open wait ends at ``now``."""
    for reason, since, waited in job_waits(conn, ns_id, job_id):
        if since is not None:
            conn.execute(
                update(W)
                .where(
                    W.c.namespace_id == ns_id, W.c.job_id == job_id, W.c.reason == reason,
                    W.c.since == since,
                )
                .values(since=None, waited_us=waited + _micros(now, since), updated_at=now)
            )  # fmt: skip


def has_open_wait(conn: Connection, ns_id: bytes, job_id: bytes) -> bool:
    return (
        conn.execute(
            select(W.c.reason)
            .where(W.c.namespace_id == ns_id, W.c.job_id == job_id, W.c.since.is_not(None))
            .limit(1)
        ).first()
        is not None
    )


def waiting_counts(conn: Connection) -> dict[tuple[bytes, str], int]:
    """PENDING jobs with an open wait, by (storage, reason): the exporter's
    ``orbit_archive_jobs_waiting``. A small table, scanned whole."""
    rows = conn.execute(
        select(J.c.storage_id, W.c.reason, func.count())
        .select_from(W.join(J, and_(J.c.namespace_id == W.c.namespace_id, J.c.id == W.c.job_id)))
        .where(W.c.since.is_not(None), J.c.state == JobState.PENDING.value)
        .group_by(J.c.storage_id, W.c.reason)
    ).all()
    return {(bytes(r[0]), str(r[1])): int(r[2]) for r in rows}


def open_waits(conn: Connection, ns_id: bytes, job_ids: Sequence[bytes]) -> dict[bytes, str]:
    """The open wait's reason of each of these jobs of one namespace that has one (``job
    list``; point lookups on the primary key's prefix)."""
    if not job_ids:
        return {}
    rows = conn.execute(
        select(W.c.job_id, W.c.reason).where(
            W.c.namespace_id == ns_id, W.c.job_id.in_(list(job_ids)), W.c.since.is_not(None)
        )
    ).all()
    return {bytes(r.job_id): str(r.reason) for r in rows}


# --- waits of jobs that were never claimed (issue 27) ---------------------------------------------


class HeldJob(NamedTuple):
    """A PENDING job a control holds, without an open wait for the reason it would wait for."""

    namespace_id: bytes
    job_id: bytes
    kind: str
    updated_at: datetime  # when it became PENDING (created, or released by its last claim)
    open_reason: str | None  # the reason of the open wait it has instead, if any


def held_where(storage_id: bytes, scopes: Iterable[Scope]) -> Any | None:
    """A WHERE clause on ``orbit_archive_jobs`` picking the jobs on this storage that one of
    ``scopes`` covers; None when none of them covers a job there (the opposite of
    :func:`not_paused`)."""
    parts = []
    for p in scopes:
        if p.storage_id not in (None, storage_id):
            continue
        if p.namespace_id is None:
            return true()
        cond = J.c.namespace_id == p.namespace_id
        if p.kind is not None:
            cond = and_(cond, J.c.kind == p.kind)
        parts.append(cond)
    return or_(*parts) if parts else None


def unrecorded_held_jobs(
    conn: Connection, storage_id: bytes, where: Any, reason: WaitReason, limit: int
) -> list[HeldJob]:
    """PENDING jobs on ``storage_id`` matching ``where`` (:func:`held_where`) with no open wait
    for ``reason``, oldest first, at most ``limit``: on ``ix_archive_job_claim``, each joined to
    its open wait by the waits' primary key. Jobs already recorded drop out, so a storage with
    many held jobs is recorded over a few ticks and then costs one empty read per tick."""
    if limit <= 0:
        return []
    rows = conn.execute(unrecorded_held_query(storage_id, where, reason, limit)).all()
    return [
        HeldJob(bytes(r[0]), bytes(r[1]), str(r[2]), r[3], None if r[4] is None else str(r[4]))
        for r in rows
    ]


def unrecorded_held_query(storage_id: bytes, where: Any, reason: WaitReason, limit: int) -> Any:
    """The statement of :func:`unrecorded_held_jobs` (EXPLAIN tests)."""
    open_wait = and_(
        W.c.namespace_id == J.c.namespace_id, W.c.job_id == J.c.id, W.c.since.is_not(None)
    )
    return (
        select(J.c.namespace_id, J.c.id, J.c.kind, J.c.updated_at, W.c.reason)
        .select_from(J.outerjoin(W, open_wait))
        .where(
            J.c.storage_id == storage_id,
            J.c.state == JobState.PENDING.value,
            where,
            or_(W.c.reason.is_(None), W.c.reason != reason.value),
        )
        .order_by(J.c.lease_until, J.c.updated_at)
        .limit(limit)
    )


def lock_if_pending_since(
    conn: Connection, ns_id: bytes, job_id: bytes, updated_at: datetime
) -> bool:
    """Lock the job's row when it is still PENDING as it was read (``updated_at`` unchanged), so
    that a claim cannot take it before the wait is written (a wait opened on a claimed job would
    be closed only at its next claim). False: it was claimed or changed meanwhile."""
    row = conn.execute(
        select(J.c.id)
        .where(
            J.c.namespace_id == ns_id,
            J.c.id == job_id,
            J.c.state == JobState.PENDING.value,
            J.c.updated_at == updated_at,
        )
        .with_for_update()
    ).first()
    return row is not None


# --- the sweep's filter -------------------------------------------------------------------------


def not_paused(storage_id: bytes, paused: Iterable[Scope]) -> Any | None:
    """A WHERE clause on ``orbit_archive_jobs`` leaving out the jobs of paused scopes on this
    storage; ``False`` (the whole storage paused) is returned as None."""
    parts = []
    for p in paused:
        if p.storage_id not in (None, storage_id):
            continue
        if p.namespace_id is None:
            return None
        cond = J.c.namespace_id == p.namespace_id
        if p.kind is not None:
            cond = and_(cond, J.c.kind == p.kind)
        parts.append(cond)
    return not_(or_(*parts)) if parts else true()
