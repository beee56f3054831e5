"""What a job row expects of its chain, and what a verification found (SPEC §5 steps 2 and 5).

Values only: :mod:`orbit_tasks.archive.format.chain` checks files against a
:class:`ChainExpectation` and answers a :class:`VerifyReport`; the runner,
``orbit job verify|export|restore`` and the tests build them.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ChainExpectation:
    """What the job row says (the chain is checked against it). ``complete`` = job SUCCEEDED.
    ``range`` = (from, until) recomputed from the database, or ``None`` to not compare it;
    ``range_ids`` = the root ids of its key bounds (SPEC §5 budget-sized ranges), None for a
    plain settled time."""

    namespace_id: bytes
    job_id: bytes
    kind: str
    storage_id: bytes
    batch_size: int
    plan_revision: int
    policy_revision: int
    batches: int
    roots: int
    bytes: int
    last_sha256: str
    complete: bool = False
    range: tuple[datetime | None, datetime] | None = None
    range_ids: tuple[builtins.bytes | None, builtins.bytes | None] = (None, None)

    @classmethod
    def from_job_row(
        cls, row: Mapping[str, Any], *, range: tuple[datetime | None, datetime] | None = None
    ) -> ChainExpectation:
        """From an ``orbit_archive_jobs`` row mapping (``complete`` iff state is SUCCEEDED)."""
        return cls(
            namespace_id=bytes(row["namespace_id"]),
            job_id=bytes(row["id"]),
            kind=str(row["kind"]),
            storage_id=bytes(row["storage_id"]),
            batch_size=int(row["batch_size"]),
            plan_revision=int(row["plan_revision"]),
            policy_revision=int(row["policy_revision"]),
            batches=int(row["batches"]),
            roots=int(row["roots"]),
            bytes=int(row["bytes"]),
            last_sha256=str(row["last_sha256"]),
            complete=row["state"] == "SUCCEEDED",
            range=range,
        )


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of a verification. Counts cover the files verified before the first problem.
    ``cursor`` = (settled, id) of the last verified root; ``beyond`` = names past the confirmed
    prefix that were ignored (only when the job is not complete)."""

    ok: bool
    first_bad_file: str | None
    reason: str | None
    batches: int
    roots: int
    bytes: int
    last_sha256: str
    final: bool
    cursor: tuple[datetime, builtins.bytes] | None = None
    beyond: tuple[str, ...] = ()
    strays: tuple[str, ...] = ()  # with allow_strays: other files at confirmed chain positions
    roots_total: int | None = None  # the manifest's, once the manifest verified
