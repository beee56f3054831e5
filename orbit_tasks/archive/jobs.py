"""Archive jobs as values: states, error codes, the Job object and its pure rules (SPEC §5).

No I/O here. Every rule that depends on time takes ``now`` (the database clock, read by the store)
so that it can be tested at its exact boundary.
"""

from __future__ import annotations

import builtins
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orbit_tasks.archive.plans import MAX_MAX_BYTES, MIN_MAX_BYTES
from orbit_tasks.errors import IllegalState, InvalidInput, StaleRevision
from orbit_tasks.timestamps import format_optional
from orbit_tasks.units import format_size


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.ABANDONED})


class ErrorCode(enum.StrEnum):
    """The fixed failure vocabulary (SPEC §5): never raw exception text, paths or content."""

    STORAGE_MISMATCH = "STORAGE_MISMATCH"
    CHAIN_BROKEN = "CHAIN_BROKEN"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    DISK_FULL = "DISK_FULL"
    IO_ERROR = "IO_ERROR"
    SOURCE_INVALID = "SOURCE_INVALID"
    SOURCE_CHANGED = "SOURCE_CHANGED"
    ROOT_TOO_LARGE = "ROOT_TOO_LARGE"
    POLICY_MISSING = "POLICY_MISSING"
    STALLED = "STALLED"
    ACCESS_DENIED = "ACCESS_DENIED"  # the object store refused (or no credentials), issue 18
    NO_SUCH_BUCKET = "NO_SUCH_BUCKET"  # the object storage's bucket does not exist, issue 18


class JobFailure(Exception):
    """Raised inside a claim when the job must go to FAILED with ``code``."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.value)
        self.code = code


@dataclass(frozen=True)
class Job:
    namespace_id: bytes
    id: bytes
    kind: str
    plan_revision: int
    policy_revision: int
    storage_id: bytes
    batch_size: int
    max_bytes: int
    state: JobState
    revision: int
    attempts: int
    batches: int
    roots: int
    bytes: int
    last_sha256: str
    error_code: str
    lease_id: builtins.bytes | None
    lease_until: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Job:
        m: Mapping[str, Any] = row._mapping if hasattr(row, "_mapping") else row
        return cls(
            namespace_id=bytes(m["namespace_id"]),
            id=bytes(m["id"]),
            kind=str(m["kind"]),
            plan_revision=int(m["plan_revision"]),
            policy_revision=int(m["policy_revision"]),
            storage_id=bytes(m["storage_id"]),
            batch_size=int(m["batch_size"]),
            max_bytes=int(m["max_bytes"]),
            state=JobState(m["state"]),
            revision=int(m["revision"]),
            attempts=int(m["attempts"]),
            batches=int(m["batches"]),
            roots=int(m["roots"]),
            bytes=int(m["bytes"]),
            last_sha256=str(m["last_sha256"]),
            error_code=str(m["error_code"]),
            lease_id=None if m["lease_id"] is None else bytes(m["lease_id"]),
            lease_until=m["lease_until"],
            created_at=m["created_at"],
            updated_at=m["updated_at"],
        )

    @property
    def has_manifest(self) -> bool:
        """The manifest is confirmed once the chain has a link (``last_sha256`` set)."""
        return self.last_sha256 != ""

    def as_dict(self) -> dict[str, Any]:
        """Operator view (CLI ``show``/``--json``): ids as hex, times as ISO strings."""
        return {
            "namespace_id": self.namespace_id.hex(),
            "id": self.id.hex(),
            "kind": self.kind,
            "plan_revision": self.plan_revision,
            "policy_revision": self.policy_revision,
            "storage_id": self.storage_id.hex(),
            "batch_size": self.batch_size,
            "max_bytes": self.max_bytes,
            "state": self.state.value,
            "revision": self.revision,
            "attempts": self.attempts,
            "batches": self.batches,
            "roots": self.roots,
            "bytes": self.bytes,
            "last_sha256": self.last_sha256,
            "error_code": self.error_code,
            "lease_until": _iso(self.lease_until),
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
        }


def _iso(value: datetime | None) -> str | None:
    return format_optional(value)


# --- rules ----------------------------------------------------------------------------------------


def lease_expired(lease_until: datetime | None, now: datetime) -> bool:
    """A lease is expired only strictly after its end: ``lease_until < now``."""
    return lease_until is not None and lease_until < now


def claimable(state: JobState, lease_until: datetime | None, now: datetime) -> bool:
    """PENDING, or RUNNING whose lease has expired (takeover)."""
    return state is JobState.PENDING or (
        state is JobState.RUNNING and lease_expired(lease_until, now)
    )


def is_takeover(state: JobState) -> bool:
    """A claim from RUNNING (expired) is a takeover; from PENDING it is a fresh/continued claim."""
    return state is JobState.RUNNING


def check_retry(state: JobState, max_bytes: int, new_max_bytes: int | None) -> int:
    """Validate a manual retry; returns the job's ``max_bytes`` after the retry.

    Only FAILED jobs can be retried (exit 3 otherwise). A lower ``--max-bytes`` is refused as
    invalid input (exit 2): the budget may only be raised (SPEC §5), and the value is checked
    against the seed's range 1 MiB..1 GiB.
    """
    if state is not JobState.FAILED:
        raise IllegalState(f"job is {state.value}; retry is allowed only from FAILED")
    if new_max_bytes is None:
        return max_bytes
    if not MIN_MAX_BYTES <= new_max_bytes <= MAX_MAX_BYTES:
        raise InvalidInput(
            f"{{max_bytes}} {new_max_bytes} is out of range (allowed {MIN_MAX_BYTES} "
            f"({format_size(MIN_MAX_BYTES)})..{MAX_MAX_BYTES} ({format_size(MAX_MAX_BYTES)}))",
            fields=("max_bytes",),
        )
    if new_max_bytes < max_bytes:
        raise InvalidInput(
            f"{{max_bytes}} {new_max_bytes} is lower than the job's max_bytes {max_bytes} "
            f"(allowed {max_bytes}..{MAX_MAX_BYTES}; a retry may only raise the budget)",
            fields=("max_bytes",),
        )
    return new_max_bytes


def check_repair(state: JobState) -> None:
    """``orbit job repair`` rebuilds files of a job no claim can write to: FAILED, SUCCEEDED or
    ABANDONED (a PENDING or RUNNING job may be claimed while the files are put back: exit 3)."""
    if state in (JobState.FAILED, JobState.SUCCEEDED, JobState.ABANDONED):
        return
    raise IllegalState(
        f"job is {state.value}; repair is allowed from FAILED, SUCCEEDED or ABANDONED "
        "(a worker may claim it meanwhile: wait until it ends)"
    )


def check_abandon(state: JobState, lease_until: datetime | None, now: datetime) -> None:
    """FAILED or PENDING may be abandoned; RUNNING only once its lease has expired."""
    if state in (JobState.FAILED, JobState.PENDING):
        return
    if state is JobState.RUNNING:
        if lease_expired(lease_until, now):
            return
        raise IllegalState(
            "job is RUNNING with a live lease; abandon is allowed once the lease has expired "
            f"(lease_until {_iso(lease_until)})"
        )
    raise IllegalState(
        f"job is {state.value}; abandon is allowed from FAILED, PENDING or an expired RUNNING"
    )


def check_expected_revision(actual: int, expected: int | None) -> None:
    if expected is not None and expected != actual:
        raise StaleRevision(
            f"{{expect_revision}} {expected} is stale (job revision is {actual})",
            fields=("expect_revision",),
        )
