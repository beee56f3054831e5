"""Every SQL statement on the id indexes of archive jobs (issue 28 item 1,
``orbit_archive_job_indexes``, revision p0009): the recorded hash of a job's index, written
once by compare-and-set on the SUCCEEDED job row it indexes; the SUCCEEDED jobs of a
(namespace, kind) with their index; the SUCCEEDED jobs of a storage without one (the tick)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, insert, literal, or_, select
from sqlalchemy.exc import IntegrityError

from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.db.platform_tables import archive_jobs as J
from orbit_tasks.db.platform_tables import job_indexes as X
from orbit_tasks.errors import ConflictError

JOB_PAGE = 500


@dataclass(frozen=True)
class IndexRow:
    """A job's recorded index: the top's SHA-256 and what it covers."""

    namespace_id: bytes
    job_id: bytes
    index_sha256: str
    last_sha256: str
    batches: int
    roots: int
    shards: int
    built_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> IndexRow:
        return cls(
            bytes(row.namespace_id), bytes(row.job_id), str(row.index_sha256),
            str(row.last_sha256), int(row.batches), int(row.roots), int(row.shards),
            row.built_at,
        )  # fmt: skip


def _key(ns_id: bytes, job_id: bytes) -> Any:
    return and_(X.c.namespace_id == ns_id, X.c.job_id == job_id)


def get_index(conn: Connection, ns_id: bytes, job_id: bytes) -> IndexRow | None:
    row = conn.execute(select(X).where(_key(ns_id, job_id))).first()
    return None if row is None else IndexRow.from_row(row)


def record_index(
    engine: Engine,
    job: Job,
    *,
    index_sha256: str,
    batches: int,
    roots: int,
    shards: int,
) -> tuple[IndexRow, bool]:
    """Record ``index_sha256`` for ``job``, once: an INSERT ... SELECT from the job row, which
    must still be SUCCEEDED with the ``batches``/``last_sha256`` the index was built from
    (compare-and-set). Returns (the recorded row, whether this call wrote it). Another builder's
    row with the same hash is fine (indexes are deterministic); any other is a conflict (exit 3),
    and so is a job row that changed."""
    values = select(
        J.c.namespace_id, J.c.id, literal(index_sha256), J.c.last_sha256, J.c.batches,
        literal(roots), literal(shards),
    ).where(
        J.c.namespace_id == job.namespace_id, J.c.id == job.id,
        J.c.state == JobState.SUCCEEDED.value, J.c.batches == batches,
        J.c.last_sha256 == job.last_sha256, J.c.roots == roots,
    )  # fmt: skip
    cols = ["namespace_id", "job_id", "index_sha256", "last_sha256", "batches", "roots", "shards"]
    written = False
    try:
        with engine.begin() as conn:
            written = conn.execute(insert(X).from_select(cols, values)).rowcount == 1
    except IntegrityError:  # another builder recorded it first
        written = False
    with engine.connect() as conn:
        row = get_index(conn, job.namespace_id, job.id)
    if row is None:
        raise ConflictError(
            f"job {job.id.hex()} is no longer SUCCEEDED with the chain its index was built from; "
            "nothing recorded"
        )
    if row.index_sha256 != index_sha256:
        raise ConflictError(
            f"job {job.id.hex()} has another index recorded ({row.index_sha256}); this build "
            f"({index_sha256}) was not recorded"
        )
    return row, written


def succeeded_with_indexes(
    conn: Connection, ns_id: bytes, kind: str
) -> Iterator[tuple[Job, IndexRow | None]]:
    """The SUCCEEDED jobs of (namespace, kind), oldest first, each with its recorded index (None:
    not indexed yet); pages on ``ix_archive_job_list`` (keyset in the expanded form)."""
    after: tuple[datetime, bytes] | None = None
    while True:
        cond = [J.c.namespace_id == ns_id, J.c.kind == kind, J.c.state == JobState.SUCCEEDED.value]
        if after is not None:
            t, i = after
            cond.append(or_(J.c.created_at > t, and_(J.c.created_at == t, J.c.id > i)))
        query = (
            select(J, *[col.label(f"x_{col.name}") for col in X.c])
            .select_from(J.outerjoin(X, and_(X.c.namespace_id == J.c.namespace_id,
                                             X.c.job_id == J.c.id)))
            .where(*cond)
            .order_by(J.c.created_at, J.c.id)
            .limit(JOB_PAGE)
        )  # fmt: skip
        rows = conn.execute(query).all()
        for row in rows:
            m = row._mapping
            index = None
            if m["x_job_id"] is not None:
                index = IndexRow(
                    bytes(m["x_namespace_id"]), bytes(m["x_job_id"]), str(m["x_index_sha256"]),
                    str(m["x_last_sha256"]), int(m["x_batches"]), int(m["x_roots"]),
                    int(m["x_shards"]), m["x_built_at"],
                )  # fmt: skip
            yield Job.from_row(row), index
        if len(rows) < JOB_PAGE:
            return
        after = (rows[-1].created_at, rows[-1].id)


def unindexed_jobs(
    conn: Connection, storage_id: bytes, limit: int, where: Any = None
) -> list[tuple[bytes, bytes, str]]:
    """At most ``limit`` SUCCEEDED jobs on ``storage_id`` without a recorded index, oldest first,
    as (namespace_id, job_id, kind); ``where`` leaves jobs out (paused scopes, closed windows).
    Runs on ``ix_archive_job_claim`` (storage_id, state) and the index table's primary key."""
    if limit <= 0:
        return []
    query = (
        select(J.c.namespace_id, J.c.id, J.c.kind)
        .select_from(J.outerjoin(X, and_(X.c.namespace_id == J.c.namespace_id,
                                         X.c.job_id == J.c.id)))
        .where(J.c.storage_id == storage_id, J.c.state == JobState.SUCCEEDED.value,
               X.c.job_id.is_(None))
        .order_by(J.c.updated_at, J.c.id)
        .limit(limit)
    )  # fmt: skip
    if where is not None:
        query = query.where(where)
    return [(bytes(r[0]), bytes(r[1]), str(r[2])) for r in conn.execute(query)]
