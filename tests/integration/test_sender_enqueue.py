"""enqueue() inside real MariaDB transactions: atomicity with the caller, idempotency, conflicts,
exact text and digest, database clock, and the due-scan index."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, bindparam, text
from sqlalchemy.orm import Session

from orbit_tasks.db.business_tables import sender_outbox
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.faults import driver_code
from orbit_tasks.errors import TransientError
from orbit_tasks.sender import InvalidRequest, OutboxConflict, OutboxRetry, enqueue
from orbit_tasks.sender.retention import prune
from orbit_tasks.sender.store import claims, entries
from tests.support.outbox_invariants import Answers, check_outbox
from tests.support.sender import new_op, rows

pytestmark = pytest.mark.mariadb

NS = "a1" * 16
Q = "b2" * 16


def _count(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        a = conn.execute(text("SELECT COUNT(*) FROM sender_outbox")).scalar_one()
        b = conn.execute(text("SELECT COUNT(*) FROM sender_jobs")).scalar_one()
    return int(a), int(b)


def test_rollback_of_the_callers_transaction_leaves_nothing(business_engine: Engine) -> None:
    with business_engine.connect() as conn:
        trans = conn.begin()
        entry = enqueue(
            conn, namespace_id=NS, queue_id=Q, operation_id=new_op(), request="{}", source_ref="r"
        )
        assert entry.created
        assert _count(business_engine) == (0, 0)  # not committed by enqueue
        trans.rollback()
    assert _count(business_engine) == (0, 0)
    with Session(business_engine) as session:
        enqueue(
            session,
            namespace_id=NS,
            queue_id=Q,
            operation_id=new_op(),
            request="{}",
            source_ref="r",
        )
        session.rollback()
    assert _count(business_engine) == (0, 0)


def test_commit_writes_both_rows_with_the_promised_values(business_engine: Engine) -> None:
    op = new_op()
    body = '{"amount": 0.1000000000000000000001, "big": 123456789012345678901234567890, "n": "😀"}'
    with Session(business_engine) as session:
        before = db_now(session.connection())
        entry = enqueue(
            session,
            namespace_id=NS,
            queue_id=Q,
            operation_id=op,
            request=body,
            source_ref="orders/😀/42",
        )
        session.commit()
    r, job = rows(business_engine)[op]
    assert r.request_json == body  # exact text, 4-byte characters intact
    assert bytes(r.request_digest) == hashlib.sha256(body.encode()).digest()
    assert r.idempotency_key == "op-" + op == entry.idempotency_key
    assert (r.state, r.send_count, r.lease_epoch, r.last_code) == ("PENDING", 0, 0, "NEW")
    assert r.task_id is None and r.receipt_json is None
    assert r.wake_at == r.created_at == r.updated_at == entry.created_at
    assert r.created_at >= before  # the database clock
    assert r.send_deadline_at == r.created_at + dt.timedelta(hours=24)
    assert (job.source_ref, job.task_id, job.created_at) == ("orders/😀/42", None, r.created_at)


def test_dict_request_is_stored_exactly(business_engine: Engine) -> None:
    op = new_op()
    with business_engine.begin() as conn:
        enqueue(
            conn,
            namespace_id=NS,
            queue_id=Q,
            operation_id=op,
            request={"b": Decimal("1.10"), "a": "😀"},
            source_ref="r",
        )
    assert rows(business_engine)[op][0].request_json == '{"a":"😀","b":1.10}'


def test_same_operation_same_body_is_idempotent(business_engine: Engine) -> None:
    op = new_op()
    args = dict(namespace_id=NS, queue_id=Q, operation_id=op, request='{"x": 1}', source_ref="r")
    with business_engine.begin() as conn:
        first = enqueue(conn, **args)  # type: ignore[arg-type]
        again = enqueue(conn, **args)  # type: ignore[arg-type]
    with business_engine.begin() as conn:
        later = enqueue(conn, **args)  # type: ignore[arg-type]
    assert first.created and not again.created and not later.created
    assert first.created_at == later.created_at
    assert _count(business_engine) == (1, 1)


@pytest.mark.parametrize(
    "change",
    [
        {"request": '{"x": 2}'},
        {"request": '{"x":1}'},  # same value, other bytes: another digest
        {"queue_id": "c3" * 16},
        {"source_ref": "other"},
    ],
)
def test_same_operation_other_content_conflicts(business_engine: Engine, change: dict) -> None:
    op = new_op()
    args = dict(namespace_id=NS, queue_id=Q, operation_id=op, request='{"x": 1}', source_ref="r")
    with business_engine.begin() as conn:
        enqueue(conn, **args)  # type: ignore[arg-type]
    with pytest.raises(OutboxConflict, match=op), business_engine.begin() as conn:
        enqueue(conn, **{**args, **change})  # type: ignore[arg-type]
    r, job = rows(business_engine)[op]
    assert r.request_json == '{"x": 1}' and r.queue_id == Q and job.source_ref == "r"


def test_refused_input_writes_nothing_and_keeps_the_transaction_usable(
    business_engine: Engine,
) -> None:
    with business_engine.begin() as conn:
        for bad in ({"token": "t"}, "[1]", {"x": 0.5}):
            with pytest.raises(InvalidRequest):
                enqueue(
                    conn,
                    namespace_id=NS,
                    queue_id=Q,
                    operation_id=new_op(),
                    request=bad,  # type: ignore[arg-type]
                    source_ref="r",
                )
        with pytest.raises(InvalidRequest, match="embeds credentials"):
            enqueue(
                conn,
                namespace_id=NS,
                queue_id=Q,
                operation_id=new_op(),
                request="{}",
                source_ref="https://u:p@host/x",
            )
        enqueue(
            conn, namespace_id=NS, queue_id=Q, operation_id=new_op(), request="{}", source_ref="r"
        )
    assert _count(business_engine) == (1, 1)


def test_json_that_mariadb_cannot_store_is_refused_before_the_insert(
    business_engine: Engine,
) -> None:
    """Python's parser accepts what ck_sender_document (JSON_VALID) refuses: more than 31 levels
    of nesting, escaped lone surrogates. enqueue() must refuse them as bad input, not fail with a
    CHECK violation from the driver (whose text holds the body)."""
    deep = '{"a":' + "[" * 31 + "]" * 31 + "}"
    with business_engine.begin() as conn:
        for bad in (deep, '{"a":"\\ud800"}'):
            with pytest.raises(InvalidRequest):
                enqueue(
                    conn,
                    namespace_id=NS,
                    queue_id=Q,
                    operation_id=new_op(),
                    request=bad,
                    source_ref="r",
                )
        enqueue(
            conn, namespace_id=NS, queue_id=Q, operation_id=new_op(), request="{}", source_ref="r"
        )
    assert _count(business_engine) == (1, 1)


def test_concurrent_enqueue_of_one_operation_yields_one_row(business_engine: Engine) -> None:
    op = new_op()
    args = dict(namespace_id=NS, queue_id=Q, operation_id=op, request='{"x": 1}', source_ref="r")
    results: list[object] = []
    with business_engine.connect() as first:
        trans = first.begin()
        enqueue(first, **args)  # type: ignore[arg-type]

        def second() -> None:
            try:
                with business_engine.begin() as conn:
                    results.append(enqueue(conn, **args))  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001
                results.append(exc)

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(1.0)  # blocked on the primary key held by the first transaction
        trans.commit()
    thread.join(30)
    (entry,) = results
    assert not isinstance(entry, Exception), entry
    assert entry.created is False  # type: ignore[attr-defined]
    assert _count(business_engine) == (1, 1)


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "READ COMMITTED"])
def test_concurrent_enqueue_in_the_applications_isolation_level(
    business_engine: Engine, isolation: str
) -> None:
    """The application's engine is its own: MariaDB's default REPEATABLE READ keeps the snapshot
    of the first read, so the re-read after the duplicate key must not be a snapshot read (it
    saw no row and raised OutboxConflict for the same request)."""
    app = make_engine(
        business_engine.url.render_as_string(hide_password=False), isolation_level=isolation
    )
    op = new_op()
    args = dict(namespace_id=NS, queue_id=Q, operation_id=op, request='{"x": 1}', source_ref="r")
    results: list[object] = []
    started = threading.Event()
    try:
        with app.connect() as first:
            trans = first.begin()
            enqueue(first, **args)  # type: ignore[arg-type]

            def second() -> None:
                try:
                    with app.begin() as conn:
                        # the application read something first: its snapshot starts here
                        conn.execute(text("SELECT COUNT(*) FROM sender_jobs")).scalar_one()
                        started.set()
                        results.append(enqueue(conn, **args))  # type: ignore[arg-type]
                except Exception as exc:  # noqa: BLE001
                    results.append(exc)

            thread = threading.Thread(target=second)
            thread.start()
            assert started.wait(10)
            thread.join(1.0)  # blocked on the primary key held by the first transaction
            trans.commit()
        thread.join(30)
        (entry,) = results
        assert not isinstance(entry, Exception), entry
        assert entry.created is False  # type: ignore[attr-defined]
        assert _count(business_engine) == (1, 1)
        # the same in a snapshot taken before the other transaction committed its row
        with app.begin() as conn:
            conn.execute(text("SELECT COUNT(*) FROM sender_jobs")).scalar_one()
            other = new_op()
            with business_engine.begin() as meanwhile:
                enqueue(meanwhile, **{**args, "operation_id": other})  # type: ignore[arg-type]
            again = enqueue(conn, **{**args, "operation_id": other})  # type: ignore[arg-type]
            assert again.created is False
            with pytest.raises(OutboxConflict):
                enqueue(conn, **{**args, "operation_id": other, "request": '{"x": 2}'})  # type: ignore[arg-type]
    finally:
        app.dispose()


def test_due_scan_uses_ix_sender_due(business_engine: Engine) -> None:
    with business_engine.begin() as conn:
        for _ in range(20):
            enqueue(
                conn,
                namespace_id=NS,
                queue_id=Q,
                operation_id=new_op(),
                request="{}",
                source_ref="r",
            )
    with business_engine.connect() as conn:
        now = db_now(conn)
        stmt = (
            sender_outbox.select()
            .with_only_columns(sender_outbox.c.operation_id)
            .where(
                sender_outbox.c.namespace_id == NS,
                sender_outbox.c.queue_id == Q,
                sender_outbox.c.wake_at <= now,
            )
            .order_by(sender_outbox.c.wake_at, sender_outbox.c.operation_id)
            .limit(5)
        )
        compiled = stmt.compile(conn, compile_kwargs={"literal_binds": True})
        plan = conn.execute(text(f"EXPLAIN {compiled}")).mappings().all()
        assert plan[0]["key"] == "ix_sender_due", plan
        assert len(claims.due_candidates(conn, NS, Q, now, 5)) == 5


# --- issue 23: the decision "this operation is new" sees committed rows ------------------------

ISOLATIONS = ["REPEATABLE READ", "READ COMMITTED", "SERIALIZABLE"]
OLD = dt.timedelta(days=8)
ARGS = dict(namespace_id=NS, queue_id=Q, request="{}", source_ref="r")


def _app_engine(business_engine: Engine, isolation: str) -> Engine:
    """The application's own engine at its own isolation level (MariaDB's default: RR)."""
    return make_engine(
        business_engine.url.render_as_string(hide_password=False), isolation_level=isolation
    )


def _snapshot(conn: Any) -> None:
    """A first read: under REPEATABLE READ the transaction's snapshot starts here. A table no
    other session writes, so that SERIALIZABLE's shared locks stop nobody."""
    conn.execute(text("SELECT COUNT(*) FROM sender_resolutions")).scalar_one()


def accept_and_prune(engine: Engine, ns: str, op: str) -> None:
    """X becomes ACCEPTED long ago, a prune moves it to sender_pruned, and its sender_jobs row
    goes (docs/sender.md allows that)."""
    with engine.begin() as conn:
        old = db_now(conn) - OLD
        conn.execute(
            text(
                "UPDATE sender_outbox SET state='ACCEPTED', wake_at=NULL, last_code='ACCEPTED', "
                'task_id=operation_id, receipt_json=\'{"task_id": "x"}\', updated_at=:old '
                "WHERE namespace_id=:ns AND operation_id=:op"
            ),
            {"old": old, "ns": ns, "op": op},
        )
    assert prune(engine, older_than_seconds=7 * 86400).total == 1
    with engine.begin() as conn:
        conn.execute(
            text("DELETE FROM sender_jobs WHERE namespace_id=:ns AND operation_id=:op"),
            {"ns": ns, "op": op},
        )


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_pruned_operation_is_not_new_in_a_snapshot_older_than_it(
    business_engine: Engine, isolation: str
) -> None:
    """Issue 23 item 1: a transaction whose snapshot is older than X enqueues X after X was
    accepted and pruned. Before: created=True under REPEATABLE READ (X sent again, or another
    body sent under X's key), X in both tables, every later prune IntegrityError 1062."""
    app = _app_engine(business_engine, isolation)
    op = new_op()
    args = dict(namespace_id=NS, queue_id=Q, operation_id=op, request='{"x": 1}', source_ref="r")
    answers = Answers()
    try:
        with app.connect() as conn:
            trans = conn.begin()
            _snapshot(conn)
            with business_engine.begin() as other:
                first = enqueue(other, **args)  # type: ignore[arg-type]
                answers.record(NS, op, '{"x": 1}', "r", first).committed()
            accept_and_prune(business_engine, NS, op)
            again = enqueue(conn, **args)  # type: ignore[arg-type]
            answer = answers.record(NS, op, '{"x": 1}', "r", again)
            assert (again.created, again.state) == (False, "ACCEPTED")
            assert (again.created_at, again.send_deadline_at) == (
                first.created_at,
                first.send_deadline_at,
            )
            for change in ({"request": '{"x": 2}'}, {"source_ref": "other"}):
                with pytest.raises(OutboxConflict):
                    enqueue(conn, **{**args, **change})  # type: ignore[arg-type]
                changed = {**args, **change}
                answers.record(
                    NS, op, changed["request"], changed["source_ref"], error=OutboxConflict()
                )
            trans.commit()
            answer.committed()
        check_outbox(business_engine, None, answers=answers)
        assert _count(business_engine) == (0, 0)  # nothing written again
        assert prune(business_engine, older_than_seconds=1).skipped_in_both == 0
    finally:
        app.dispose()


def _accept_old(engine: Engine, ops: list[str]) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sender_outbox SET state='ACCEPTED', wake_at=NULL, last_code='ACCEPTED', "
                'task_id=operation_id, receipt_json=\'{"task_id": "x"}\', updated_at=:old '
                "WHERE namespace_id=:ns AND operation_id IN :ops"
            ).bindparams(bindparam("ops", expanding=True)),
            {"old": db_now(conn) - OLD, "ns": NS, "ops": ops},
        )


def test_a_prune_skips_an_operation_found_in_both_tables(
    business_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 23 item 1: an operation in both tables (written by the defect above, or by hand)
    never makes every later prune fail (before: IntegrityError 1062 on every run): it is
    skipped, counted and logged; its live row stays."""
    ops = sorted(new_op() for _ in range(3))
    with business_engine.begin() as conn:
        for op in ops:
            enqueue(conn, **{**ARGS, "operation_id": op})  # type: ignore[arg-type]
    accept_and_prune(business_engine, NS, ops[0])
    with business_engine.begin() as conn:  # the defect's live row of a pruned operation
        entries.insert_entry(
            conn,
            namespace_id=NS,
            queue_id=Q,
            operation_id=ops[0],
            request_json="{}",
            request_digest=hashlib.sha256(b"{}").digest(),
            source_ref="r",
            now=db_now(conn),
        )
    _accept_old(business_engine, ops)
    for _ in range(2):
        with caplog.at_level(logging.WARNING, logger="orbit.sender.retention"):
            report = prune(business_engine, older_than_seconds=7 * 86400)
        assert report.skipped_in_both == 1
        assert "sender.prune.already_pruned" in caplog.text and ops[0] in caplog.text
        caplog.clear()
    assert report.total == 0  # the second run: ops[1] and ops[2] went in the first
    table = rows(business_engine)
    assert set(table) == {ops[0]} and table[ops[0]][0].state == "ACCEPTED"  # never deleted


def _wait_for_lock_wait(engine: Engine, timeout: float = 30.0) -> None:
    """Until a transaction of this test's database waits for a lock (bounded polling)."""
    end = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT COUNT(*) FROM information_schema.INNODB_TRX t JOIN "
                    "information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                    "WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()"
                )
            ).scalar_one()
        if waiting:
            return
        assert time.monotonic() < end, "no transaction ever waited for the lock"
        time.sleep(0.05)


def test_a_deadlock_in_enqueue_is_outbox_retry_with_the_drivers_1213(
    business_engine: Engine,
) -> None:
    """Issue 23 item 5: when the server picks enqueue()'s transaction as a deadlock victim it
    rolls the whole transaction back, so the savepoint is gone; before, the application got
    OperationalError 1305 'SAVEPOINT sa_savepoint_1 does not exist' (the 1213 only in
    __context__). Now: OutboxRetry (a TransientError), code 1213, the driver's 1213 its cause."""
    with business_engine.begin() as conn:
        conn.execute(text("CREATE TABLE app_lock (id INT PRIMARY KEY)"))
        conn.execute(text("INSERT INTO app_lock VALUES (1)"))
    op = new_op()
    args = dict(namespace_id=NS, queue_id=Q, operation_id=op, request='{"x": 1}', source_ref="r")
    raised: list[BaseException] = []
    with business_engine.connect() as holder, business_engine.connect() as victim:
        holder_trans = holder.begin()
        victim_trans = victim.begin()
        victim.execute(text("SELECT id FROM app_lock WHERE id = 1 FOR UPDATE")).all()
        enqueue(holder, **args)  # type: ignore[arg-type]

        def second() -> None:
            try:
                enqueue(victim, **args)  # type: ignore[arg-type]  # waits for the holder's row
            except BaseException as exc:  # noqa: BLE001
                raised.append(exc)

        thread = threading.Thread(target=second)
        thread.start()
        _wait_for_lock_wait(business_engine)
        # the holder now waits for the victim's lock: a cycle; the lighter one is rolled back
        holder.execute(text("SELECT id FROM app_lock WHERE id = 1 FOR UPDATE")).all()
        thread.join(30)
        holder_trans.commit()
        victim_trans.rollback()
    (exc,) = raised
    assert isinstance(exc, OutboxRetry) and isinstance(exc, TransientError), repr(exc)
    assert exc.code == 1213 and driver_code(exc.__cause__) == 1213
    assert "deadlock" in str(exc) and op in str(exc)
    assert _count(business_engine) == (1, 1)


@pytest.mark.parametrize("same_operation", [True, False], ids=["same-op", "one-gap"])
def test_serializable_concurrent_enqueues_do_not_deadlock(
    business_engine: Engine, same_operation: bool
) -> None:
    """Issue 23 item 5: two SERIALIZABLE transactions enqueue at once (the same operation, or
    two new ones in one index gap): before, 20 of 20 pairs deadlocked (each read took a shared
    gap lock its neighbour's insert then waited for). Now both commit, one row each."""
    app = _app_engine(business_engine, "SERIALIZABLE")
    answers = Answers()
    try:
        for pair in range(5):
            base = secrets.token_hex(15)
            ops = [base + "10", base + ("10" if same_operation else "11")]
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []

            def one(op: str, barrier: threading.Barrier, errors: list[BaseException]) -> None:
                try:
                    with app.begin() as conn:
                        _snapshot(conn)
                        barrier.wait(10)
                        got = enqueue(
                            conn,
                            namespace_id=NS,
                            queue_id=Q,
                            operation_id=op,
                            request='{"x": 1}',
                            source_ref="r",
                        )
                        answer = answers.record(NS, op, '{"x": 1}', "r", got)
                    answer.committed()
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)

            threads = [threading.Thread(target=one, args=(op, barrier, errors)) for op in ops]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors, (pair, [repr(e) for e in errors])
        check_outbox(business_engine, None, answers=answers)
        assert _count(business_engine) == ((5, 5) if same_operation else (10, 10))
    finally:
        app.dispose()
