"""Every SQL statement of the exporter (docs/metrics.md), read-only, in both databases.

Hot queries (run at every refresh) stay on index ranges; the tests assert their plans:
- jobs in PENDING/RUNNING/FAILED: ``ix_archive_job_claim`` (storage_id, state, ...) for the
  registered storages, a range over unfinished jobs only;
- SUCCEEDED/ABANDONED jobs that became so after a cut time: ``ix_archive_job_claim`` on its full
  prefix (storage_id, state, lease_until IS NULL, updated_at > cut). Terminal jobs never change
  again, so the counts before the cut are taken by an occasional full recount
  (``terminal_recount_query``) instead of at every scrape;
- overdue plans: ``ix_archive_plan_due`` (storage_id, enabled, next_run_at);
- PENDING/SENDING outbox rows: ``ix_sender_due`` (namespace_id, queue_id, wake_at), per
  (namespace, queue) pair found by the loose index scan of the sender store.
REVIEW/ACCEPTED outbox rows have no index of their own in the seed (which we do not change), so
counting them is one scan of ``sender_outbox`` per refresh; bench/metrics_scrape.py measures it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, Select, and_, case, func, or_, select, true

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.db.business_tables import sender_outbox, sender_resolutions
from orbit_tasks.db.platform_tables import (
    archive_jobs,
    archive_plans,
    archive_storages,
    namespaces,
    retirements,
)
from orbit_tasks.platform.history import history_kind
from orbit_tasks.platform.store import RetiredKind
from orbit_tasks.sender import holds as sender_holds
from orbit_tasks.sender.store import deadlines as sender_deadlines

J = archive_jobs.c
P = archive_plans.c
O = sender_outbox.c  # noqa: E741 - the table's one-letter alias, as in the sender store
R = sender_resolutions.c

ACTIVE_JOB_STATES = (JobState.PENDING.value, JobState.RUNNING.value, JobState.FAILED.value)
TERMINAL_JOB_STATES = (JobState.SUCCEEDED.value, JobState.ABANDONED.value)
# (namespace, queue) pairs per outbox statement: keeps the OR list the range optimizer gets short.
PAIRS_PER_STATEMENT = 200

JobKey = tuple[bytes, str, str]  # (storage, kind, state)


class Totals(NamedTuple):
    """What a group of jobs holds: how many, and the bytes, roots, files (batches plus the
    manifest) they confirmed and the claims they took (``attempts``, chained claims included)."""

    jobs: int
    bytes: int
    roots: int
    files: int
    claims: int


def _totals(r: Any) -> Totals:
    return Totals(
        int(r.jobs), int(r.bytes or 0), int(r.roots or 0), int(r.files or 0), int(r.claims or 0)
    )


def _confirmed_columns() -> tuple[Any, ...]:
    return (
        func.sum(J.bytes).label("bytes"),
        func.sum(J.roots).label("roots"),
        (func.sum(J.batches) + _count_if(J.last_sha256 != "")).label("files"),
        func.sum(J.attempts).label("claims"),
    )


def _count_if(cond: Any) -> Any:
    return func.sum(case((cond, 1), else_=0))


# --- platform database ---------------------------------------------------------------------------


def storages_query() -> Select[Any]:
    """Every registered storage with its label and whether it is retired (issue 27)."""
    s, r = archive_storages.c, retirements.c
    return (
        select(s.storage_id, s.label, r.target_id.is_not(None).label("retired"))
        .select_from(
            archive_storages.outerjoin(
                retirements,
                and_(r.target_kind == RetiredKind.STORAGE.value, r.target_id == s.storage_id),
            )
        )
        .order_by(s.storage_id)
    )


class Storages(NamedTuple):
    """The registered storages: id -> label of those not retired, and the retired ones."""

    live: dict[bytes, str]
    retired: frozenset[bytes]


def registered_storages(conn: Connection) -> Storages:
    rows = conn.execute(storages_query()).all()
    return Storages(
        {bytes(r.storage_id): str(r.label) for r in rows if not r.retired},
        frozenset(bytes(r.storage_id) for r in rows if r.retired),
    )


def namespace_names(conn: Connection) -> dict[str, str]:
    """Namespace hex id -> name, every namespace (a small registry, read whole)."""
    rows = conn.execute(select(namespaces.c.id, namespaces.c.name))
    return {bytes(r[0]).hex(): str(r[1]) for r in rows}


def active_jobs_query(storages: Sequence[bytes], now: dt.datetime) -> Select[Any]:
    """Unfinished jobs grouped by (storage, state, kind, error_code) with the oldest
    ``updated_at`` (PENDING: when it became PENDING), expired leases and confirmed bytes."""
    return (
        select(
            J.storage_id,
            J.state,
            J.kind,
            J.error_code,
            func.count().label("jobs"),
            func.min(J.updated_at).label("oldest_updated_at"),
            _count_if(J.lease_until < now).label("expired"),
            *_confirmed_columns(),
        )
        .where(J.storage_id.in_(storages), J.state.in_(ACTIVE_JOB_STATES))
        .group_by(J.storage_id, J.state, J.kind, J.error_code)
    )


def terminal_since_query(storages: Sequence[bytes], cut: dt.datetime) -> Select[Any]:
    """SUCCEEDED/ABANDONED jobs that reached that state after ``cut`` (their ``updated_at`` is
    the moment of the change and never moves again; ``lease_until`` is NULL for them by
    ``ck_archive_job_lease``, which puts ``updated_at`` in the index range)."""
    return _terminal_counts(
        J.storage_id.in_(storages),
        J.state.in_(TERMINAL_JOB_STATES),
        J.lease_until.is_(None),
        J.updated_at > cut,
    )


def terminal_recount_query(cut: dt.datetime) -> Select[Any]:
    """Every SUCCEEDED/ABANDONED job up to ``cut``: a scan of the table, run only at the
    recount period (docs/metrics.md), never at every scrape."""
    return _terminal_counts(J.state.in_(TERMINAL_JOB_STATES), J.updated_at <= cut)


def _terminal_counts(*where: Any) -> Select[Any]:
    """Jobs and bytes per (storage, state, kind) of the terminal jobs matching ``where``."""
    return (
        select(
            J.storage_id,
            J.state,
            J.kind,
            func.count().label("jobs"),
            *_confirmed_columns(),
        )
        .where(*where)
        .group_by(J.storage_id, J.state, J.kind)
    )


def overdue_plans_query(storages: Sequence[bytes], due_before: dt.datetime) -> Select[Any]:
    return (
        select(P.storage_id, func.count().label("plans"))
        .where(P.storage_id.in_(storages), P.enabled == true(), P.next_run_at < due_before)
        .group_by(P.storage_id)
    )


def terminal_counts(conn: Connection, query: Select[Any]) -> dict[JobKey, Totals]:
    """(storage, kind, state) -> totals of a terminal-jobs query."""
    return {(bytes(r.storage_id), r.kind, r.state): _totals(r) for r in conn.execute(query)}


def active_totals(r: Any) -> Totals:
    """The totals of one row of :func:`active_jobs_query`."""
    return _totals(r)


def active_jobs(conn: Connection, storages: Sequence[bytes], now: dt.datetime) -> list[Any]:
    if not storages:
        return []
    return list(conn.execute(active_jobs_query(storages, now)))


def overdue_plans(
    conn: Connection, storages: Sequence[bytes], due_before: dt.datetime
) -> dict[bytes, int]:
    if not storages:
        return {}
    return {
        bytes(r.storage_id): int(r.plans)
        for r in conn.execute(overdue_plans_query(storages, due_before))
    }


# --- business database ---------------------------------------------------------------------------


def active_outbox_query(pairs: Sequence[tuple[str, str]], soon: dt.datetime) -> Select[Any]:
    """PENDING/SENDING rows (``wake_at`` is set exactly for them, ``ck_sender_state``) of the
    given (namespace, queue) pairs: count, oldest ``created_at``, deadlines before ``soon``."""
    return (
        select(
            O.state,
            func.count().label("rows"),
            func.min(O.created_at).label("oldest_created_at"),
            _count_if(O.send_deadline_at < soon).label("near_deadline"),
        )
        .where(
            or_(*(and_(O.namespace_id == ns, O.queue_id == q) for ns, q in pairs)),
            O.wake_at.is_not(None),
        )
        .group_by(O.state)
    )


def terminal_outbox_query() -> Select[Any]:
    """ACCEPTED and REVIEW rows by (state, last_code): one scan of the table (no seed index),
    with how many of them hold a current resolution (``sender_resolutions`` by primary key and
    the review it was recorded on; orbit_tasks/sender/review.py)."""
    return (
        select(
            O.state,
            O.last_code,
            func.count().label("rows"),
            _count_if(R.namespace_id.is_not(None)).label("resolved"),
        )
        .select_from(
            sender_outbox.outerjoin(
                sender_resolutions,
                and_(
                    R.namespace_id == O.namespace_id,
                    R.operation_id == O.operation_id,
                    R.review_since == O.updated_at,
                ),
            )
        )
        .where(O.wake_at.is_(None))
        .group_by(O.state, O.last_code)
    )


def running_holds(conn: Connection, now: dt.datetime) -> list[Any]:
    """The Retry-After holds still running (``sender_holds``, one row per held queue)."""
    return sender_holds.running_holds(conn, now)


def outbox_pairs(conn: Connection) -> list[tuple[str, str]]:
    return sender_deadlines.outbox_queues(conn)


def active_outbox(
    conn: Connection, pairs: Sequence[tuple[str, str]], soon: dt.datetime
) -> list[Any]:
    out: list[Any] = []
    for start in range(0, len(pairs), PAIRS_PER_STATEMENT):
        chunk = pairs[start : start + PAIRS_PER_STATEMENT]
        out += conn.execute(active_outbox_query(chunk, soon)).all()
    return out


def terminal_outbox(conn: Connection) -> list[Any]:
    return list(conn.execute(terminal_outbox_query()))


# --- plan backlogs (issue 25 item 4) --------------------------------------------------------------


class PlanRow(NamedTuple):
    namespace_id: bytes
    namespace: str
    kind: str
    policy_revision: int
    interval_seconds: int


def enabled_plans(conn: Connection) -> list[PlanRow]:
    """Every enabled plan with its namespace's name (the backlog gauge's labels)."""
    query = (
        select(P.namespace_id, namespaces.c.name, P.kind, P.policy_revision, P.interval_seconds)
        .join(namespaces, namespaces.c.id == P.namespace_id)
        .where(P.enabled == true())
        .order_by(P.namespace_id, P.kind)
    )
    return [
        PlanRow(bytes(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]))
        for r in conn.execute(query)
    ]


class BacklogProbe(NamedTuple):
    """The first ``cap + 1`` roots of a backlog range at most: how many were read, and the
    settled times of the first and the last of them (None: the range is empty)."""

    counted: int
    first: dt.datetime | None
    last: dt.datetime | None


def backlog_probe(
    conn: Connection, kind: str, ns_id: bytes, rng: ArchiveRange, cap: int
) -> BacklogProbe:
    """Roots of ``kind`` with ``from <= settled < until``, counted on the kind's settled index
    (namespace_id, settled, id) up to ``cap + 1`` entries: a bounded read, however long the
    backlog (``families.backlog_roots`` extrapolates beyond the cap)."""
    if rng.empty:
        return BacklogProbe(0, None, None)
    row = conn.execute(backlog_probe_query(kind, ns_id, rng, cap)).one()
    return BacklogProbe(int(row[0]), row[1], row[2])


def backlog_probe_query(kind: str, ns_id: bytes, rng: ArchiveRange, cap: int) -> Select[Any]:
    """The statement of :func:`backlog_probe`."""
    hk = history_kind(kind)
    cond = [hk.root.c.namespace_id == ns_id, hk.settled < rng.until]
    if rng.from_ is not None:
        cond.append(hk.settled >= rng.from_)
    first = (
        select(hk.settled.label("settled"))
        .where(*cond)
        .order_by(hk.settled, hk.root.c.id)
        .limit(cap + 1)
        .subquery()
    )
    columns: list[Any] = [func.count(), func.min(first.c.settled), func.max(first.c.settled)]
    return select(*columns)
