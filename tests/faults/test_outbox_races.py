"""The outbox under the application's own isolation level and an operator's races (issue 23):
real MariaDB, the reference API subprocess, real relay passes and real ``orbit`` processes.

- prunes in a loop racing enqueues from transactions whose snapshot is older than the operations
  they enqueue (accepted and pruned meanwhile), at REPEATABLE READ, READ COMMITTED and
  SERIALIZABLE;
- ``orbit sender resolve`` processes racing ``orbit sender requeue --code`` processes and the
  relay: the requeue's page read before the resolves, its page locked during them, and free.

Each ends with the one invariant checker (tests/support/outbox_invariants.py) on the business
database and the API's own database.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, bindparam, text

from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.sender import OutboxConflict, OutboxRetry, enqueue
from orbit_tasks.sender.retention import prune
from tests.support import sender as sender_support
from tests.support.cli import REPO, orbit_env, run_orbit
from tests.support.outbox_invariants import Answers, check_outbox
from tests.support.sender import World, check_invariants, drive, make_relay, new_op

pytestmark = [pytest.mark.mariadb]

world = sender_support.world
business = sender_support.business

ISOLATIONS = ["REPEATABLE READ", "READ COMMITTED", "SERIALIZABLE"]
WEEK = 7 * 86400


def _bounded(pred: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _in_pruned(engine: Engine, ops: list[str]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT COUNT(*) FROM sender_pruned WHERE operation_id IN :ops").bindparams(
                    bindparam("ops", expanding=True)
                ),
                {"ops": ops},
            ).scalar_one()
        )


@contextmanager
def _prune_loop(engine: Engine) -> Iterator[list[BaseException]]:
    """``prune --older-than 7d`` in a loop in its own thread; yields the errors it met."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                prune(engine, older_than_seconds=WEEK)
            except Exception as exc:  # noqa: BLE001 - the test asserts there are none
                errors.append(exc)
            stop.wait(0.02)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(60)


def _body(op: str) -> str:
    return json.dumps({"op": op, "amount": "1.10"})


def _enqueue(conn: Any, ns: str, queue: str, op: str) -> Any:
    """Operation ``op`` with its own body and source_ref (what every test here enqueues)."""
    return enqueue(
        conn,
        namespace_id=ns,
        queue_id=queue,
        operation_id=op,
        request=_body(op),
        source_ref=f"orders/{op}",
    )


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_prunes_racing_enqueues_from_snapshots_older_than_the_operation(
    world: World, business: tuple[str, Engine], isolation: str
) -> None:
    """Each round: three application transactions take their snapshot; then operations are
    enqueued, sent to the real API, accepted and backdated, and the prune loop moves them to
    sender_pruned (half of them also lose their sender_jobs row); then each transaction
    enqueues every one of them again (same request: the acceptance; another: OutboxConflict)
    plus one new operation shared by the three. Before issue 23, under REPEATABLE READ: created
    again, sent again, in both tables, and every later prune failed with 1062."""
    url, engine = business
    app = make_engine(url, isolation_level=isolation)
    relay = make_relay(engine, world.api.base_url, world.token)
    answers = Answers()
    ns, queue = world.ns, world.queues[0]
    try:
        with _prune_loop(engine) as prune_errors:
            for _round in range(3):
                conns = [app.connect() for _ in range(3)]
                for conn in conns:
                    conn.begin()
                    # the snapshot (REPEATABLE READ) starts here; a table nobody else writes
                    conn.execute(text("SELECT COUNT(*) FROM sender_resolutions")).scalar_one()
                ops = [new_op() for _ in range(4)]
                with engine.begin() as setup:
                    for op in ops:
                        got = _enqueue(setup, ns, queue, op)
                        answers.record(ns, op, _body(op), f"orders/{op}", got).committed()
                drive(relay, engine, timeout=60)
                with engine.begin() as setup:
                    setup.execute(
                        text(
                            "UPDATE sender_outbox SET updated_at = :old WHERE operation_id IN :ops"
                        ).bindparams(bindparam("ops", expanding=True)),
                        {"old": db_now(setup) - dt.timedelta(days=8), "ops": ops},
                    )
                _bounded(lambda ops=ops: _in_pruned(engine, ops) == len(ops), "the prune loop")
                with engine.begin() as setup:  # docs/sender.md: sender_jobs rows may go
                    setup.execute(
                        text("DELETE FROM sender_jobs WHERE operation_id IN :ops").bindparams(
                            bindparam("ops", expanding=True)
                        ),
                        {"ops": ops[:2]},
                    )
                shared = new_op()
                with ThreadPoolExecutor(len(conns)) as pool:
                    jobs = [
                        pool.submit(_enqueue_all, c, answers, ns, queue, ops, shared) for c in conns
                    ]
                    for job in jobs:
                        job.result()
            drive(relay, engine, timeout=60)  # the shared new operations
        assert not prune_errors, [repr(e) for e in prune_errors]
        report = prune(engine, older_than_seconds=WEEK)  # every later prune works
        assert report.skipped_in_both == 0
        check_outbox(engine, world.platform, answers=answers)
        check_invariants(engine, world.platform)
    finally:
        relay.client.close()
        app.dispose()


def _enqueue_all(
    conn: Any, answers: Answers, ns: str, queue: str, ops: list[str], shared: str
) -> None:
    """One application transaction: every pruned operation again (same request and source_ref,
    then another request), then the new shared operation; commit. An OutboxRetry rolls the whole
    transaction back (what the application does, docs/sender.md)."""
    mine = []
    try:
        for op in ops:
            args = dict(namespace_id=ns, queue_id=queue, operation_id=op, source_ref=f"orders/{op}")
            got = enqueue(conn, request=_body(op), **args)
            mine.append(answers.record(ns, op, _body(op), f"orders/{op}", got))
            assert (got.created, got.state) == (False, "ACCEPTED"), (op, got)
            try:
                enqueue(conn, request='{"another": 1}', **args)
            except OutboxConflict as exc:
                answers.record(ns, op, '{"another": 1}', f"orders/{op}", error=exc)
            else:
                raise AssertionError(f"another request for {op} was not a conflict")
        got = _enqueue(conn, ns, queue, shared)
        mine.append(answers.record(ns, shared, _body(shared), f"orders/{shared}", got))
        conn.commit()
        for answer in mine:
            answer.committed()
    except OutboxRetry as exc:
        answers.record(ns, shared, _body(shared), f"orders/{shared}", error=exc)
        conn.rollback()
    finally:
        conn.close()


# --- dead letters: resolve vs requeue --code vs the relay --------------------------------------

CODE = "QUEUE_FORBIDDEN"


def _forbidden(engine: Engine, world: World, n: int) -> list[str]:
    """``n`` operations in REVIEW QUEUE_FORBIDDEN, never sent (what a narrow credential does)."""
    ops = sorted(new_op() for _ in range(n))
    with engine.begin() as conn:
        for op in ops:
            _enqueue(conn, world.ns, world.queues[1], op)
        conn.execute(
            text(
                "UPDATE sender_outbox SET state='REVIEW', wake_at=NULL, last_code=:code, "
                "send_count=1, lease_epoch=1 WHERE operation_id IN :ops"
            ).bindparams(bindparam("ops", expanding=True)),
            {"code": CODE, "ops": ops},
        )
    return ops


def _requeue_process(env: dict[str, str], failpoint: str | None) -> subprocess.Popen[str]:
    extra = {"ORBIT_FAILPOINTS": failpoint} if failpoint else {}
    return subprocess.Popen(
        [str(REPO / ".venv/bin/orbit"), "sender", "requeue", "--code", CODE, "--json"],
        env={**env, **extra},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _resolve_all(env: dict[str, str], ns: str, ops: list[str]) -> dict[str, int]:
    """``orbit sender resolve NS OP`` for each op, four processes at a time: op -> exit code."""

    def one(op: str) -> int:
        done = run_orbit(["sender", "resolve", ns, op, "--reason", "handled by hand"], env)
        assert done.returncode in (0, 3), (op, ops, done.returncode, done.stderr)
        if done.returncode == 3:  # requeued first (PENDING, SENDING, ACCEPTED), or resolved
            said = done.stderr  # by `resolve --code` first
            assert "only REVIEW rows are resolved" in said or "already resolved" in said, said
        return done.returncode

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(ops, pool.map(one, ops), strict=True))


def _wait_marker(marker: Path, proc: subprocess.Popen[str]) -> None:
    end = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "failpoint never reached"
        time.sleep(0.05)


def _requeued(proc: subprocess.Popen[str], ops: list[str]) -> dict[str, str]:
    """op -> what the bulk requeue said of it, for ``ops`` (earlier rounds' rows are listed too:
    resolved, refused)."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return {
        i["operation_id"]: i["action"] for i in json.loads(out)["items"] if i["operation_id"] in ops
    }


def _lock_waits(engine: Engine) -> int:
    """Sessions waiting for a row lock of this test's database (the server is shared)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w "
                    "JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id "
                    "WHERE l.lock_table LIKE :tables"
                ),
                {"tables": f"`{engine.url.database}`.%"},
            ).scalar_one()
        )


def test_resolves_racing_a_bulk_requeue_and_the_relay(
    world: World, business: tuple[str, Engine], tmp_path: Path
) -> None:
    """Issue 23 item 2: 260 resolves racing one ``requeue --code``: all answered "resolved",
    200 were sent. Four rounds with real processes while the relay sends: (a) the requeue read
    its page before the resolves committed (before: requeued and sent anyway), (b) the requeue
    holds its requeued page uncommitted while the resolves run (before: "resolved", then sent),
    (c) no failpoint at all, (d) ``resolve --code`` and ``requeue --code`` at once with named
    resolves. A resolved row is never sent; a requeued row is never reported resolved."""
    url, engine = business
    env = orbit_env(world.platform_url, url)
    relay = make_relay(engine, world.api.base_url, world.token)
    stop = threading.Event()
    paused = threading.Event()
    relay_errors: list[BaseException] = []

    def relaying() -> None:
        while not stop.is_set():
            if paused.is_set():
                stop.wait(0.1)
                continue
            try:
                relay.run_pass(budget_seconds=2.0)
            except Exception as exc:  # noqa: BLE001 - asserted empty
                relay_errors.append(exc)
            stop.wait(0.1)

    sender = threading.Thread(target=relaying, daemon=True)
    sender.start()
    resolved: set[tuple[str, str]] = set()
    requeued: set[tuple[str, str]] = set()

    def tally(codes: dict[str, int], actions: dict[str, str]) -> None:
        resolved.update((world.ns, op) for op, code in codes.items() if code == 0)
        requeued.update((world.ns, op) for op, a in actions.items() if a == "requeued")

    try:
        # (a) the page is read, nothing locked; every resolve commits first
        ops = _forbidden(engine, world, 4)
        marker = tmp_path / "after-page"
        proc = _requeue_process(env, f"sender.requeue.after_page=hold:{marker}")
        _wait_marker(marker, proc)
        codes = _resolve_all(env, world.ns, ops)
        assert set(codes.values()) == {0}
        marker.unlink()
        actions = _requeued(proc, ops)
        assert set(actions.values()) == {"refused"}, actions
        tally(codes, actions)

        # (b) the page is requeued and held uncommitted; the resolves wait, then refuse
        ops = _forbidden(engine, world, 4)
        marker = tmp_path / "before-commit"
        proc = _requeue_process(env, f"sender.requeue.before_commit=hold:{marker}")
        _wait_marker(marker, proc)
        paused.set()
        with ThreadPoolExecutor(1) as pool:
            later = pool.submit(_resolve_all, env, world.ns, ops)
            # a resolve waits for the requeue's row locks (or, on a slow machine, comes after
            # the commit: it must refuse as well); well inside the lock wait bound (5 s)
            started = time.monotonic()
            _bounded(
                lambda: _lock_waits(engine) >= 1 or time.monotonic() - started > 3,
                "a resolve to wait",
            )
            marker.unlink()
            codes = later.result(timeout=120)
        paused.clear()
        actions = _requeued(proc, ops)
        assert set(actions.values()) == {"requeued"} and set(codes.values()) == {3}
        tally(codes, actions)

        # (c) free: one bulk requeue and the resolves at once
        ops = _forbidden(engine, world, 8)
        proc = _requeue_process(env, None)
        codes = _resolve_all(env, world.ns, ops)
        actions = _requeued(proc, ops)
        tally(codes, actions)
        assert {(world.ns, op) for op in ops} <= resolved | requeued

        # (d) the two bulk commands at once, and named resolves of half the rows
        ops = _forbidden(engine, world, 8)
        proc = _requeue_process(env, None)
        bulk = subprocess.Popen(
            [str(REPO / ".venv/bin/orbit"), "sender", "resolve", "--code", CODE, "--json"]
            + ["--reason", "bulk"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        codes = _resolve_all(env, world.ns, ops[::2])
        out, err = bulk.communicate(timeout=120)
        assert bulk.returncode == 0, err
        by_bulk = {i["operation_id"]: i["action"] for i in json.loads(out)["items"]}
        actions = _requeued(proc, ops)
        tally(codes, actions)
        resolved.update((world.ns, op) for op in ops if by_bulk.get(op) == "resolved")
        assert {(world.ns, op) for op in ops} <= resolved | requeued

        _bounded(lambda: sender_support.open_count(engine) == 0, "the relay to send", 120)
    finally:
        stop.set()
        sender.join(60)
        relay.client.close()
    assert not relay_errors, [repr(e) for e in relay_errors]
    check_outbox(engine, world.platform, resolved=resolved, requeued_in_bulk=requeued)
    check_invariants(engine, world.platform)
