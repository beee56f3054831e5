"""enqueue() inside real MariaDB transactions: atomicity with the caller, idempotency, conflicts,
exact text and digest, database clock, and the due-scan index."""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from decimal import Decimal

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.sender import InvalidRequest, OutboxConflict, enqueue
from orbit_tasks.sender import store as sender_store
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
            sender_store.o.select()
            .with_only_columns(sender_store.o.c.operation_id)
            .where(
                sender_store.o.c.namespace_id == NS,
                sender_store.o.c.queue_id == Q,
                sender_store.o.c.wake_at <= now,
            )
            .order_by(sender_store.o.c.wake_at, sender_store.o.c.operation_id)
            .limit(5)
        )
        compiled = stmt.compile(conn, compile_kwargs={"literal_binds": True})
        plan = conn.execute(text(f"EXPLAIN {compiled}")).mappings().all()
        assert plan[0]["key"] == "ix_sender_due", plan
        assert len(sender_store.due_candidates(conn, NS, Q, now, 5)) == 5
