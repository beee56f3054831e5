"""The one invariant checker of the outbox's fault tests (issue 23), read at the end of every test
that races the outbox: from the business database and the reference API's own database.

- one platform task per operation (per namespace and ``op-`` key), whatever the outbox says;
- no operation in both ``sender_outbox`` and ``sender_pruned``;
- no send after its deadline: every platform task of an operation was created at or before the
  operation's ``send_deadline_at`` (both databases run on one server, one clock);
- no resolved row sent: an operation an operator was told "resolved" (and did not requeue by
  name afterwards) is still REVIEW with that resolution current (or pruned as resolved REVIEW),
  and no platform task was created at or after the resolution; no operation was told both
  "resolved" and "requeued" by the bulk commands;
- every ``enqueue()`` answer right: per operation, the request the database holds is the one of
  the single committed ``created=True`` answer (or of the operation that was there before),
  every ``created=False`` answer carried that request, every ``OutboxConflict`` another one.

Usage: record each ``enqueue()`` answer with :meth:`Answers.record` (inside the caller's
transaction, then :meth:`Answer.committed` once it committed), then call :func:`check_outbox`.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select

from orbit_tasks.db.business_tables import (
    sender_jobs,
    sender_outbox,
    sender_pruned,
    sender_resolutions,
)
from orbit_tasks.db.history_tables import tasks


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


@dataclass
class Answer:
    """One ``enqueue()`` call and what it answered: ``created`` True/False, or the exception
    class name (``OutboxConflict``, ``OutboxRetry``)."""

    namespace_id: str
    operation_id: str
    request_digest: bytes
    source_ref: str
    created: bool | None = None
    error: str | None = None
    state: str | None = None
    was_committed: bool = False

    def committed(self) -> None:
        self.was_committed = True


@dataclass
class Answers:
    """Every answer of a test, thread-safe; ``before``: operations there before the test with
    their (request, source_ref)."""

    items: list[Answer] = field(default_factory=list)
    before: dict[tuple[str, str], tuple[bytes, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self,
        ns: str,
        op: str,
        request: str,
        source_ref: str,
        result: Any = None,
        error: BaseException | None = None,
    ) -> Answer:
        answer = Answer(ns, op, _digest(request), source_ref)
        if error is not None:
            answer.error = type(error).__name__
        else:
            answer.created, answer.state = bool(result.created), result.state
        with self._lock:
            self.items.append(answer)
        return answer

    def existed(self, ns: str, op: str, request: str, source_ref: str) -> None:
        self.before[(ns, op)] = (_digest(request), source_ref)


@dataclass(frozen=True)
class Report:
    outbox: int
    pruned: int
    tasks: int
    states: dict[str, int]


def _table(engine: Engine, table: Any) -> dict[tuple[str, str], Any]:
    with engine.connect() as conn:
        return {(r.namespace_id, r.operation_id): r for r in conn.execute(select(table))}


def _platform_tasks(platform: Engine, keys: Iterable[tuple[str, str]]) -> dict[Any, list[Any]]:
    wanted = {(bytes.fromhex(ns), "op-" + op): (ns, op) for ns, op in keys}
    found: dict[Any, list[Any]] = {}
    if not wanted:
        return found
    key_list = sorted({key for _, key in wanted})
    with platform.connect() as conn:
        for start in range(0, len(key_list), 500):
            for row in conn.execute(
                select(tasks.c.namespace_id, tasks.c.idempotency_key, tasks.c.created_at).where(
                    tasks.c.idempotency_key.in_(key_list[start : start + 500])
                )
            ):
                op_key = wanted.get((bytes(row.namespace_id), row.idempotency_key))
                if op_key is not None:
                    found.setdefault(op_key, []).append(row)
    return found


def check_outbox(
    business: Engine,
    platform: Engine | None,
    *,
    answers: Answers | None = None,
    resolved: Iterable[tuple[str, str]] = (),
    requeued_in_bulk: Iterable[tuple[str, str]] = (),
    requeued_by_name: Iterable[tuple[str, str]] = (),
) -> Report:
    """Assert every invariant above; ``resolved``/``requeued_in_bulk``/``requeued_by_name``:
    the operations the CLI reported so (``resolve`` exit 0 or action ``resolved``; ``requeue
    --code`` action ``requeued``; ``requeue NS OP`` exit 0 after the resolve)."""
    outbox = _table(business, sender_outbox)
    pruned = _table(business, sender_pruned)
    jobs = _table(business, sender_jobs)
    resolutions = _table(business, sender_resolutions)
    both = sorted(set(outbox) & set(pruned))
    assert not both, f"operations in both sender_outbox and sender_pruned: {both[:5]}"

    keys = set(outbox) | set(pruned)
    sent = _platform_tasks(platform, keys) if platform is not None else {}
    for key, found in sent.items():
        assert len(found) == 1, f"{len(found)} platform tasks for operation {key}"
        deadline = (outbox.get(key) or pruned[key]).send_deadline_at
        assert found[0].created_at <= deadline, (
            f"operation {key} sent after its deadline: task created {found[0].created_at}, "
            f"send_deadline_at {deadline}"
        )

    told_resolved = set(resolved)
    both_told = told_resolved & set(requeued_in_bulk)
    assert not both_told, f"reported both resolved and requeued: {sorted(both_told)[:5]}"
    for key in told_resolved - set(requeued_by_name):
        resolution = resolutions.get(key)
        assert resolution is not None, f"reported resolved, no resolution: {key}"
        row = outbox.get(key)
        if row is not None:
            assert row.state == "REVIEW" and row.updated_at == resolution.review_since, (
                f"reported resolved but {row.state} since {row.updated_at}: {key}"
            )
        else:
            assert pruned[key].state == "REVIEW", f"reported resolved, pruned as sent: {key}"
        late = [t for t in sent.get(key, []) if t.created_at >= resolution.resolved_at]
        assert not late, f"resolved row sent: {key}"

    if answers is not None:
        _check_answers(answers, outbox, pruned, jobs)
    states: dict[str, int] = {}
    for row in outbox.values():
        states[row.state] = states.get(row.state, 0) + 1
    return Report(len(outbox), len(pruned), sum(len(v) for v in sent.values()), states)


def _truth(key: Any, outbox: dict[Any, Any], pruned: dict[Any, Any], jobs: dict[Any, Any]) -> Any:
    """(request digest, source_ref digest or None) the database holds for ``key``."""
    job = jobs.get(key)
    ref = None if job is None else _digest(job.source_ref)
    if key in outbox:
        return bytes(outbox[key].request_digest), ref
    if key in pruned:
        record = pruned[key]
        held = record.source_ref_digest
        return bytes(record.request_digest), ref or (None if held is None else bytes(held))
    return None, None


def _check_answers(
    answers: Answers, outbox: dict[Any, Any], pruned: dict[Any, Any], jobs: dict[Any, Any]
) -> None:
    by_op: dict[tuple[str, str], list[Answer]] = {}
    for a in answers.items:
        by_op.setdefault((a.namespace_id, a.operation_id), []).append(a)
    for key, given in by_op.items():
        digest, ref = _truth(key, outbox, pruned, jobs)
        created = [a for a in given if a.created and a.was_committed]
        if key in answers.before:
            assert not created, f"{key} existed before, yet an enqueue created it again"
        else:
            committed = [a for a in given if a.was_committed and a.error is None]
            if committed:
                assert len(created) == 1, f"{key}: {len(created)} committed created=True answers"
        if digest is None:
            assert not created, f"{key}: answered created and committed, but not in the database"
            continue
        for a in given:
            same = a.request_digest == digest and (ref is None or _digest(a.source_ref) == ref)
            if a.error == "OutboxConflict":
                assert not same, f"{key}: OutboxConflict for the request the database holds"
            elif a.error is None and a.was_committed:
                assert same, f"{key}: answered created={a.created} for another request"
            elif a.error is None and not a.created:
                # rolled back: what it saw was committed, so it matched then and matches now
                assert same, f"{key}: answered existing for another request"
