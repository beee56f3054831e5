"""Every SQL statement of ``orbit archive coverage`` (issue 28 item 2): the SUCCEEDED jobs of a
(namespace, kind) with their recorded ends, their policies' ``archive_after_seconds`` and their
latest scrubs -- one statement per plan, whatever its number of jobs (``ix_archive_job_list``).
The backlog is the plan preview's (``engine/preview.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, select

from orbit_tasks.archive.coverage import CoveredJob
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.platform_tables import archive_job_ends as E
from orbit_tasks.db.platform_tables import archive_jobs as J
from orbit_tasks.db.platform_tables import archive_policies as P
from orbit_tasks.db.platform_tables import archive_scrubs as S


def coverage_query(ns_id: bytes, kind: str) -> Any:
    ends = and_(E.c.namespace_id == J.c.namespace_id, E.c.job_id == J.c.id)
    policy = and_(
        P.c.namespace_id == J.c.namespace_id, P.c.kind == J.c.kind,
        P.c.revision == J.c.policy_revision,
    )  # fmt: skip
    scrub = and_(S.c.namespace_id == J.c.namespace_id, S.c.job_id == J.c.id)
    return (
        select(
            J.c.id,
            J.c.created_at,
            J.c.updated_at,
            J.c.storage_id,
            J.c.roots,
            J.c.batches,
            J.c.bytes,
            P.c.archive_after_seconds,
            E.c.range_until.label("end_at"),
            E.c.until_id.label("end_id"),
            S.c.range_from,
            S.c.from_id,
            S.c.range_until,
            S.c.until_id,
            S.c.verified_at,
            S.c.checked_at,
            S.c.outcome,
            S.c.first_bad_file,
        )  # fmt: skip
        .select_from(J.outerjoin(E, ends).outerjoin(P, policy).outerjoin(S, scrub))
        .where(J.c.namespace_id == ns_id, J.c.kind == kind, J.c.state == JobState.SUCCEEDED.value)
        .order_by(J.c.created_at, J.c.id)
    )


def _id(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def covered_jobs(conn: Connection, ns_id: bytes, kind: str) -> list[CoveredJob]:
    """The SUCCEEDED jobs of (namespace, kind) in creation order, one statement."""
    out = []
    for r in conn.execute(coverage_query(ns_id, kind)):
        verified = r.range_until is not None
        out.append(
            CoveredJob(
                job_id=bytes(r.id), created_at=r.created_at, succeeded_at=r.updated_at,
                storage_id=bytes(r.storage_id), roots=int(r.roots), batches=int(r.batches),
                bytes=int(r.bytes),
                archive_after_seconds=(
                    None if r.archive_after_seconds is None else int(r.archive_after_seconds)
                ),
                recorded_end=None if r.end_at is None else (r.end_at, _id(r.end_id)),
                verified_start=(
                    None if not verified or r.range_from is None
                    else (r.range_from, _id(r.from_id))
                ),
                verified_end=(r.range_until, _id(r.until_id)) if verified else None,
                verified_at=r.verified_at, checked_at=r.checked_at, outcome=r.outcome,
                first_bad_file=str(r.first_bad_file or ""),
            )
        )  # fmt: skip
    return out
