"""Builders of real ``orbit-archive/1`` chains for tests (pure: bytes in memory)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from orbit_tasks.archive.format import batch as ff
from orbit_tasks.archive.format import manifest as fm
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.format.expectation import ChainExpectation
from orbit_tasks.platform.history import HISTORY_KINDS

NS = bytes.fromhex("0190f0aa000070008000000000000001")
JOB = bytes.fromhex("0190f0aa000070008000000000000002")
STORAGE = bytes.fromhex("0190f0aa000070008000000000000003")
T0 = datetime(2026, 3, 1, 12, 0, 0)
UNTIL = datetime(2026, 3, 2)
KIND = HISTORY_KINDS["tasks"]


def rid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def record(i: int, *, settled: datetime | None = None, attempts: int = 1) -> ff.RootRecord:
    """Root ``i`` of kind tasks (settled at T0 + i s) with ``attempts`` attempt rows."""
    return ff.RootRecord(
        root={
            "namespace_id": NS,
            "id": rid(i),
            "queue_id": rid(1000),
            "state": "SUCCEEDED",
            "idempotency_key": f"op-{i}",
            "request_json": '{"amount":1.10,"big":12345678901234567890.000,"n":"\U0001f600"}',
            "result_json": None,
            "error_code": "",
            "attempts": attempts,
            "created_at": T0,
            "started_at": T0,
            "finished_at": settled if settled is not None else T0 + timedelta(seconds=i),
        },
        children={
            "orbit_task_attempts": [
                {
                    "namespace_id": NS,
                    "task_id": rid(i),
                    "attempt_no": n,
                    "state": "DONE",
                    "worker": "w1",
                    "error_code": "",
                    "started_at": T0,
                    "finished_at": T0 + timedelta(microseconds=999999),
                }
                for n in range(1, attempts + 1)
            ]
        },
    )


@dataclass
class Chain:
    files: list[tuple[str, bytes]]
    expect: ChainExpectation

    def name(self, seq: int) -> str:
        return self.files[seq][0]

    def data(self, seq: int) -> bytes:
        return self.files[seq][1]


def manifest(**over: Any) -> bytes:
    args: dict[str, Any] = {
        "namespace_id": NS,
        "job_id": JOB,
        "kind": "tasks",
        "plan_revision": 3,
        "policy_revision": 2,
        "storage_id": STORAGE,
        "batch_size": 2,
        "range_from": None,
        "range_until": UNTIL,
        "roots_total": 5,
        "source": fm.source_descriptor(KIND),
        "created_at": T0,
    }
    args.update(over)
    return fm.build_manifest(**args)


def build_chain(
    groups: Sequence[Sequence[ff.RootRecord]] = (),
    *,
    finals: Sequence[bool] | None = None,
    seqs: Sequence[int] | None = None,
    prevs: dict[int, str] | None = None,
    complete: bool = True,
    **manifest_over: Any,
) -> Chain:
    """A chain: manifest + one batch per group. Overrides make deliberately broken chains:
    ``finals``/``seqs`` per batch, ``prevs`` {index: prev_sha256}."""
    if not groups:
        groups = [[record(1), record(2)], [record(3), record(4)], [record(5)]]
    manifest_over.setdefault("roots_total", sum(len(g) for g in groups))
    man = manifest(**manifest_over)
    link = fv.sha256_hex(man)
    files = [(file_names.manifest_name(link), man)]
    for j, recs in enumerate(groups):
        data = ff.build_batch(
            job_id=JOB,
            seq=seqs[j] if seqs else j + 1,
            prev_sha256=(prevs or {}).get(j, link),
            records=recs,
            settled_column="finished_at",
            final=finals[j] if finals else j == len(groups) - 1,
        )
        link = fv.sha256_hex(data)
        files.append((file_names.batch_name(j + 1, link), data))
    expect = ChainExpectation(
        namespace_id=NS,
        job_id=JOB,
        kind="tasks",
        storage_id=STORAGE,
        batch_size=manifest_over.get("batch_size", 2),
        plan_revision=3,
        policy_revision=2,
        batches=len(groups),
        roots=sum(len(g) for g in groups),
        bytes=sum(len(d) for _, d in files),
        last_sha256=link,
        complete=complete,
    )
    return Chain(files, expect)


def with_expect(base: Chain | ChainExpectation, **over: Any) -> ChainExpectation:
    """The chain's (or an expectation's) job-row values with some fields changed."""
    return replace(base.expect if isinstance(base, Chain) else base, **over)
