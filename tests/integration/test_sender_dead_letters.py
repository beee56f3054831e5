"""Dead letters in bulk (issue 17 item 2, docs/sender.md "Dead letters") through the real CLI,
with real sender workers, the reference API and the exporter: ``requeue --code`` requeues every
REVIEW row of a code and lists the refused ones, ``resolve`` records who and why, ``list
--unresolved`` shows what is left, and ``orbit_outbox_review_rows`` (the alert's metric) falls.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, select, update

from orbit_tasks.db.business_tables import sender_outbox, sender_resolutions
from orbit_tasks.db.engine import db_now
from orbit_tasks.sender import enqueue
from tests.support import sender as sender_support
from tests.support.cli import orbit_env, run_orbit
from tests.support.metrics import running_exporter, value
from tests.support.sender import REDIS_URL, Workers, World, body_for, celery_env

pytestmark = [pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

world = sender_support.world
o = sender_outbox.c
CODE = "QUEUE_FORBIDDEN"


def _rows(engine: Engine, ns: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return {
            r.operation_id: r
            for r in conn.execute(select(sender_outbox).where(o.namespace_id == ns))
        }


def _until(pred: Any, timeout: float, what: str, app: Celery | None = None) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        if app is not None:
            app.send_task("orbit.sender.tick", queue="orbit.sender", expires=5)
        time.sleep(0.5)


def _cli(env: dict[str, str], *args: str, code: int = 0) -> Any:
    done = run_orbit(["sender", *args], env)
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    if code:
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        return done.stderr
    return json.loads(done.stdout) if "--json" in args else done.stdout


def _review_metric(exporter: Any) -> float | None:
    return value(exporter.scrape(), "orbit_outbox_review_rows", last_code=CODE)


# The whole flow on MariaDB only: the CLI and the workers are the same code on both backends,
# and the SQL of requeue/resolve/prune runs on SQLite too in the tests below and in
# test_sender_retention.py (this one flow took 33 s per backend).
@pytest.mark.parametrize("business_db", ["mariadb"], indirect=True)
def test_bulk_requeue_and_resolve_through_the_cli_and_the_metric_falls(
    world: World,
    business_db: tuple[str, Engine],
    workers: Workers,
    beat: Celery,
    tmp_path: Path,
) -> None:
    url, engine = business_db
    ns, other = world.ns, world.queues[1]
    ops = [secrets.token_hex(16) for _ in range(6)]
    bodies = {op: body_for(i) for i, op in enumerate(ops)}
    with engine.begin() as conn:
        for op in ops:
            enqueue(
                conn,
                namespace_id=ns,
                queue_id=other,
                operation_id=op,
                request=bodies[op],
                source_ref=f"orders/{op[:8]}",
            )
    # A sender whose credential allows only queues[0]: every row goes to REVIEW QUEUE_FORBIDDEN.
    first = workers.start(
        "sender-q0", celery_env(url, world.platform_url, world.api.base_url, world.token_q0)
    )
    _until(
        lambda: all(r.state == "REVIEW" for r in _rows(engine, ns).values()),
        60,
        "REVIEW",
        beat,
    )
    workers.kill(first)
    assert {r.last_code for r in _rows(engine, ns).values()} == {CODE}
    late, spent = ops[4], ops[5]
    with engine.begin() as conn:
        now = db_now(conn)
        created = now - dt.timedelta(hours=25)
        conn.execute(
            update(sender_outbox)
            .where(o.namespace_id == ns, o.operation_id == late)
            .values(created_at=created, send_deadline_at=created + dt.timedelta(hours=24))
        )
        conn.execute(
            update(sender_outbox)
            .where(o.namespace_id == ns, o.operation_id == spent)
            .values(send_count=100, lease_epoch=100)
        )

    env = orbit_env(world.platform_url, url, ORBIT_ACTOR="alice")
    exporter_env = {
        **env,
        "CELERY_BROKER_URL": REDIS_URL,
        "ORBIT_METRICS_CACHE_SECONDS": "0",
    }
    with running_exporter(exporter_env, tmp_path) as exporter:
        assert _review_metric(exporter) == 6

        # Usage: NS OP or --code, one line, exit 2, nothing changed.
        before = _rows(engine, ns)
        refused_args: list[list[str]] = [
            ["requeue", "--code", CODE, ns, ops[0]],
            ["requeue"],
            ["requeue", ns, ops[0], "--namespace", ns],
            ["requeue", "--code", "NOPE"],
            ["resolve", "--code", CODE],
            ["resolve", ns, ops[0], "--reason", " "],
            ["resolve", ns, ops[0], "--reason", "two\nlines"],
            ["list", "--unresolved", "--state", "ACCEPTED"],
        ]
        with ThreadPoolExecutor(4) as pool:  # independent refusals: four CLI processes at once
            list(pool.map(lambda a: _cli(env, *a, code=2), refused_args))
        assert _rows(engine, ns) == before

        # Dry run: what would happen, nothing changes.
        dry = _cli(env, "requeue", "--code", CODE, "--namespace", ns, "--dry-run", "--json")
        actions = {i["operation_id"]: i["action"] for i in dry["items"]}
        assert dry["next"] is None
        assert actions == {
            **{op: "would_requeue" for op in ops[:4]},
            late: "refused",
            spent: "refused",
        }
        why = {i["operation_id"]: i["why"] for i in dry["items"]}
        assert "send deadline" in why[late] and "has passed" in why[late]
        assert "send_count 100 reached the limit of 100 sends" in why[spent]
        assert _rows(engine, ns) == before

        # The queue is granted (a sender with the full credential), then everything requeued.
        workers.start(
            "sender-all", celery_env(url, world.platform_url, world.api.base_url, world.token)
        )
        text_out = _cli(env, "requeue", "--code", CODE)
        assert "requeue --code QUEUE_FORBIDDEN: 2 refused, 4 requeued" in text_out
        for op in (late, spent):
            assert op in text_out  # the refused rows are listed
        after = _rows(engine, ns)
        for op in ops[:4]:  # same key and body, send_count kept
            assert after[op].idempotency_key == before[op].idempotency_key == "op-" + op
            assert after[op].request_json == before[op].request_json
            assert after[op].send_count >= before[op].send_count
        _until(
            lambda: all(_rows(engine, ns)[op].state == "ACCEPTED" for op in ops[:4]),
            60,
            "ACCEPTED",
            beat,
        )
        exporter.wait_for(
            lambda s: value(s, "orbit_outbox_review_rows", last_code=CODE) == 2, 30, "2 left"
        )

        # One row refused alone: exit 3, one line.
        assert "send_count 100" in _cli(env, "requeue", ns, spent, code=3)
        unresolved = _cli(env, "list", "--unresolved", "--namespace", ns, "--json")
        assert sorted(i["operation_id"] for i in unresolved["items"]) == sorted([late, spent])

        # Resolve: one by NS OP, the rest by code; who and why are recorded.
        one = _cli(env, "resolve", ns, late, "--reason", "expired: re-created as order 7", "--json")
        assert (one["resolved_by"], one["last_code"]) == ("alice", CODE)
        exporter.wait_for(
            lambda s: value(s, "orbit_outbox_review_rows", last_code=CODE) == 1, 30, "1 left"
        )
        bulk = _cli(
            env,
            "resolve",
            "--code",
            CODE,
            "--namespace",
            ns,
            "--reason",
            "100 sends: handled by hand (ticket 42)",
            "--json",
        )
        assert [(i["operation_id"], i["action"]) for i in bulk["items"]] == [(spent, "resolved")]
        exporter.wait_for(
            lambda s: value(s, "orbit_outbox_review_rows", last_code=CODE) == 0, 30, "none left"
        )
        rows_metric = exporter.scrape()
        assert value(rows_metric, "orbit_outbox_rows", state="REVIEW") == 2  # still REVIEW rows
        assert _cli(env, "list", "--unresolved", "--json")["items"] == []
        again = _cli(env, "resolve", ns, late, "--reason", "again", code=3)
        assert "already resolved by alice" in again
        shown = _cli(env, "show", ns, spent, "--json")
        assert (shown["resolved_by"], shown["reason"]) == (
            "alice",
            "100 sends: handled by hand (ticket 42)",
        )
        assert shown["state"] == "REVIEW" and shown["pruned"] is False

        # Resolved rows may be pruned after the retention; enqueue() still answers as before.
        assert _cli(env, "prune", "--older-than", "1h", "--json")["review"] == 0
        with engine.begin() as conn:
            conn.execute(
                update(sender_resolutions).values(resolved_at=db_now(conn) - dt.timedelta(hours=2))
            )
        pruned = _cli(env, "prune", "--older-than", "1h", "--namespace", ns, "--json")
        assert (pruned["review"], pruned["accepted"]) == (2, 0)
        assert set(_rows(engine, ns)) == set(ops[:4])
        with engine.begin() as conn:
            entry = enqueue(
                conn,
                namespace_id=ns,
                queue_id=other,
                operation_id=spent,
                request=bodies[spent],
                source_ref=f"orders/{spent[:8]}",
            )
        assert (entry.created, entry.state) == (False, "REVIEW")
        shown = _cli(env, "show", ns, spent, "--json")
        assert shown["pruned"] is True and shown["state"] == "REVIEW"
        assert value(exporter.scrape(), "orbit_outbox_review_rows", last_code=CODE) == 0
    out = workers.output()
    assert "sender.row.accepted" in out


def test_a_bulk_requeue_leaves_resolved_rows_alone_and_a_named_requeue_sends_one(
    business_db: tuple[str, Engine],
) -> None:
    """A row an operator marked as handled ("re-created by hand under new ids") is not sent
    again by ``requeue --code``: it is listed as refused, naming who resolved it, and stays
    REVIEW and resolved; an unresolved row of the code is requeued. Naming the resolved row
    (``requeue NS OP``) is the deliberate way to send it, and ends its resolution."""
    from orbit_tasks.sender import review

    _url, engine = business_db
    ns = secrets.token_hex(16)
    handled, open_row = secrets.token_hex(16), secrets.token_hex(16)
    with engine.begin() as conn:
        for i, op in enumerate((handled, open_row)):
            enqueue(
                conn, namespace_id=ns, queue_id=secrets.token_hex(16), operation_id=op,
                request=body_for(i), source_ref=f"orders/{op[:8]}",
            )  # fmt: skip
        conn.execute(
            update(sender_outbox)
            .where(o.namespace_id == ns)
            .values(state="REVIEW", wake_at=None, last_code=CODE, send_count=1, lease_epoch=1)
        )
    review.resolve_one(engine, ns, handled, reason="re-created by hand", actor="alice")

    dry = review.requeue_code(engine, CODE, ns, dry_run=True)
    assert {i["operation_id"]: i["action"] for i in dry} == {
        handled: "refused",
        open_row: "would_requeue",
    }
    items = review.requeue_code(engine, CODE, ns, dry_run=False)
    actions = {i["operation_id"]: (i["action"], i["why"]) for i in items}
    assert actions[open_row] == ("requeued", None)
    assert actions[handled][0] == "refused" and "resolved by alice" in actions[handled][1]
    rows = _rows(engine, ns)
    assert (rows[handled].state, rows[open_row].state) == ("REVIEW", "PENDING")
    with engine.connect() as conn:
        still = conn.execute(
            select(sender_resolutions.c.resolved_by).where(
                sender_resolutions.c.operation_id == handled
            )
        ).all()
    assert [r.resolved_by for r in still] == ["alice"]

    review.requeue_one(engine, ns, handled)  # named: the operator means it
    assert _rows(engine, ns)[handled].state == "PENDING"
