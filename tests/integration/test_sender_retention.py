"""Retention of the outbox (issue 17 item 1, docs/sender.md "Retention") with real parts: the
reference API subprocess, ``celery worker -Q orbit.sender`` processes, the real ``orbit`` CLI,
MariaDB and SQLite business databases.

- prune under load: the relay runs and new operations keep coming while half of the accepted rows
  (backdated) are pruned; no PENDING or SENDING row is touched, the count is exact, a re-enqueue
  of every pruned operation with its body creates no platform task, another body is a conflict;
- SIGKILL of a prune in the middle of a page: nothing half-done (each pruned row has its compact
  record and each compact record its missing row); the next prune finishes;
- an enqueue racing a prune held before its commit gets one of the two right answers;
- the page scan is a primary-key range (EXPLAIN on MariaDB); bad durations are one line, exit 2;
- ``ORBIT_SENDER_RETENTION`` runs the same prune from a sender worker (``orbit.sender.prune``);
- revision b0002 on a b0001 database with rows (MariaDB, SQLite) and rendered for MySQL 8.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from celery import Celery
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.dialects import mysql

from orbit_tasks.db.business_tables import sender_outbox, sender_pruned
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.history_tables import tasks
from orbit_tasks.db.migrate import alembic_config, render_sql, upgrade
from orbit_tasks.db.migrations.business import b0001_tables, b0002_tables
from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.sender import OutboxConflict, enqueue
from orbit_tasks.sender.retention import PAGE_ROWS, prune
from orbit_tasks.sender.store import entries, pruning
from tests.support import sender as sender_support
from tests.support.cli import REPO, orbit_env, run_orbit
from tests.support.db import mariadb_database, open_write_transactions
from tests.support.sender import (
    Workers,
    World,
    body_for,
    captured_sql,
    celery_env,
    explain,
    platform_task_count,
)

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]

world = sender_support.world
o = sender_outbox.c
OLD = dt.timedelta(days=8)  # backdated: older than --older-than 7d


def _tick(app: Celery) -> None:
    app.send_task("orbit.sender.tick", queue="orbit.sender", expires=5)


def _states(engine: Engine, ns: str | None = None) -> dict[str, int]:
    stmt = select(o.state, func.count()).group_by(o.state)
    if ns is not None:
        stmt = stmt.where(o.namespace_id == ns)
    with engine.connect() as conn:
        return {s: int(n) for s, n in conn.execute(stmt)}


def _settle(app: Celery, engine: Engine, ns: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        states = _states(engine, ns)
        if not states.get("PENDING") and not states.get("SENDING"):
            return
        _tick(app)
        time.sleep(0.5)
    raise AssertionError(f"rows of {ns} still open: {_states(engine, ns)}")


def _enqueue(engine: Engine, ns: str, queue: str, ops_bodies: list[tuple[str, str]]) -> None:
    with engine.begin() as conn:
        for op, body in ops_bodies:
            enqueue(
                conn,
                namespace_id=ns,
                queue_id=queue,
                operation_id=op,
                request=body,
                source_ref=f"orders/{op[:8]}",
            )


def _backdate(engine: Engine, ns: str, ops: list[str], by: dt.timedelta = OLD) -> None:
    with engine.begin() as conn:
        old = db_now(conn) - by
        for start in range(0, len(ops), 200):
            conn.execute(
                update(sender_outbox)
                .where(o.namespace_id == ns, o.operation_id.in_(ops[start : start + 200]))
                .values(updated_at=old)
            )


def _all_rows(engine: Engine) -> dict[tuple[str, str], tuple[Any, ...]]:
    with engine.connect() as conn:
        return {
            (r.namespace_id, r.operation_id): tuple(r) for r in conn.execute(select(sender_outbox))
        }


def _pruned(engine: Engine) -> dict[tuple[str, str], Any]:
    with engine.connect() as conn:
        return {(r.namespace_id, r.operation_id): r for r in conn.execute(select(sender_pruned))}


def _ns_task_count(platform: Engine, ns: str) -> int:
    with platform.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(tasks.c.namespace_id == bytes.fromhex(ns))
            ).scalar_one()
        )


def _prune_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_orbit(["sender", "prune", "--older-than", "7d", "--json", *args], env)


# --- prune under load ----------------------------------------------------------------------------


@pytest.mark.slow
def test_prune_under_load_keeps_every_promise(
    world: World,
    business_db: tuple[str, Engine],
    workers: Workers,
    beat: Celery,
    tmp_path: Path,
) -> None:
    url, engine = business_db
    ns, queue = world.ns, world.queues[0]
    accepted = [(secrets.token_hex(16), body_for(i)) for i in range(120)]
    _enqueue(engine, ns, queue, accepted)
    env = celery_env(url, world.platform_url, world.api.base_url, world.token)
    workers.start("sender-retention", env)
    _settle(beat, engine, ns)
    assert _states(engine, ns) == {"ACCEPTED": 120}
    old_ops = [op for op, _ in accepted[::2]]  # half of them, backdated
    _backdate(engine, ns, old_ops)

    # Rows no sender will touch, all backdated too: PENDING rows of a namespace without a
    # credential here, and SENDING rows whose lease runs for an hour. Only their state keeps
    # them from the prune.
    other = secrets.token_hex(16)
    held = [(secrets.token_hex(16), body_for(i)) for i in range(6)]
    _enqueue(engine, other, queue, held)
    with engine.begin() as conn:
        now = db_now(conn)
        conn.execute(
            update(sender_outbox)
            .where(o.namespace_id == other, o.operation_id.in_([op for op, _ in held[:3]]))
            .values(
                state="SENDING", send_count=1, lease_epoch=1, wake_at=now + dt.timedelta(hours=1)
            )
        )
    _backdate(engine, other, [op for op, _ in held])
    untouchable = {k: v for k, v in _all_rows(engine).items() if k[0] == other}
    assert len(untouchable) == 6

    # Load: new operations keep coming and the relay keeps sending while the prune runs.
    stop = threading.Event()
    fresh: list[str] = []
    errors: list[BaseException] = []

    def load() -> None:
        try:
            i = 0
            while not stop.is_set():
                batch = [(secrets.token_hex(16), body_for(1000 + i + k)) for k in range(5)]
                _enqueue(engine, ns, queue, batch)
                fresh.extend(op for op, _ in batch)
                _tick(beat)
                i += 5
                time.sleep(0.1)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        time.sleep(1.0)
        cli_env = orbit_env(world.platform_url, url)
        done = _prune_cli(cli_env)
    finally:
        stop.set()
        loader.join(60)
    assert not errors, errors
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["pruned"] == len(old_ops) == 60  # exactly the backdated ACCEPTED rows
    assert (report["accepted"], report["review"], report["dry_run"]) == (60, 0, False)
    assert fresh, "no load ran during the prune"
    _settle(beat, engine, ns)

    rows = _all_rows(engine)
    pruned = _pruned(engine)
    assert set(pruned) == {(ns, op) for op in old_ops}
    assert not set(pruned) & set(rows)
    assert {k: v for k, v in rows.items() if k[0] == other} == untouchable  # not even written
    for op, _ in accepted[1::2]:
        assert rows[(ns, op)][sender_outbox.c.keys().index("state")] == "ACCEPTED"
    with engine.connect() as conn:  # sender_jobs rows stay, with their task id
        jobs = {r.operation_id: r.task_id for r in conn.execute(text("SELECT * FROM sender_jobs"))}
    for op in old_ops:
        assert jobs[op] == pruned[(ns, op)].task_id and pruned[(ns, op)].state == "ACCEPTED"

    # Every pruned operation enqueued again with its body: the existing acceptance, nothing sent.
    tasks_before = _ns_task_count(world.platform, ns)
    bodies = dict(accepted)
    with engine.begin() as conn:
        for op in old_ops:
            entry = enqueue(
                conn,
                namespace_id=ns,
                queue_id=queue,
                operation_id=op,
                request=bodies[op],
                source_ref=f"orders/{op[:8]}",
            )
            assert (entry.created, entry.state) == (False, "ACCEPTED")
            assert entry.idempotency_key == "op-" + op
    for _ in range(4):
        _tick(beat)
        time.sleep(0.5)
    _settle(beat, engine, ns)
    assert _ns_task_count(world.platform, ns) == tasks_before
    assert set(platform_task_count(world.platform, ["op-" + op for op in old_ops]).values()) == {1}
    assert set(_pruned(engine)) == set(pruned) and not set(pruned) & set(_all_rows(engine))

    # ... and with another body, queue or source_ref: the conflict, as before the prune.
    for op in old_ops[:10]:
        for change in (
            {"request": '{"another": 1}'},
            {"queue_id": world.queues[1]},
            {"source_ref": "orders/another"},
        ):
            args: dict[str, Any] = {
                "namespace_id": ns,
                "queue_id": queue,
                "operation_id": op,
                "request": bodies[op],
                "source_ref": f"orders/{op[:8]}",
                **change,
            }
            with pytest.raises(OutboxConflict), engine.begin() as conn:
                enqueue(conn, **args)
    assert _ns_task_count(world.platform, ns) == tasks_before
    assert "sender.row.accepted" in workers.output()


# --- SIGKILL in the middle of a page -------------------------------------------------------------


def _accepted_directly(engine: Engine, ns: str, n: int) -> list[str]:
    """``n`` rows made ACCEPTED by SQL (the prune does not care how), all backdated."""
    ops = [secrets.token_hex(16) for _ in range(n)]
    queue = secrets.token_hex(16)
    for start in range(0, n, 200):
        _enqueue(
            engine, ns, queue, [(op, body_for(i)) for i, op in enumerate(ops[start : start + 200])]
        )
    with engine.begin() as conn:
        for start in range(0, n, 200):
            conn.execute(
                update(sender_outbox)
                .where(o.namespace_id == ns, o.operation_id.in_(ops[start : start + 200]))
                .values(
                    state="ACCEPTED",
                    wake_at=None,
                    last_code="ACCEPTED",
                    task_id=o.operation_id,
                    receipt_json='{"task_id": "x"}',
                )
            )
    _backdate(engine, ns, ops)
    return ops


def _nothing_half_done(engine: Engine, ns: str, ops: list[str]) -> int:
    rows = {k[1] for k in _all_rows(engine) if k[0] == ns}
    pruned = {k[1] for k in _pruned(engine) if k[0] == ns}
    assert rows | pruned == set(ops) and not rows & pruned, (len(rows), len(pruned))
    return len(pruned)


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "failpoint never reached"
        time.sleep(0.05)


def _prune_process(env: dict[str, str], failpoint: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(REPO / ".venv/bin/orbit"), "sender", "prune", "--older-than", "7d", "--json"],
        env={**env, "ORBIT_FAILPOINTS": failpoint},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_sigkill_mid_page_leaves_nothing_half_done(
    world: World, business_db: tuple[str, Engine], tmp_path: Path
) -> None:
    url, engine = business_db
    ns = secrets.token_hex(16)
    ops = _accepted_directly(engine, ns, PAGE_ROWS + 100)
    marker = tmp_path / "prune-page-2"
    env = orbit_env(world.platform_url, url)
    proc = _prune_process(env, f"sender.prune.before_commit=pause@2:{marker}")
    try:
        _wait_for(marker, proc)  # page 1 committed; page 2 deleted and recorded, not committed
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    if url.startswith("mysql"):
        end = time.monotonic() + 30
        while open_write_transactions(engine) and time.monotonic() < end:
            time.sleep(0.1)  # the server rolls the killed session's page back
    assert _nothing_half_done(engine, ns, ops) == PAGE_ROWS  # exactly the committed page
    done = _prune_cli(env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pruned"] == 100
    assert _nothing_half_done(engine, ns, ops) == len(ops)


def test_enqueue_racing_a_prune_gets_one_of_the_two_right_answers(
    world: World, business_db: tuple[str, Engine], tmp_path: Path
) -> None:
    """The prune holds its page (deleted + recorded, not committed) while enqueues of the same
    operations run: they wait for the prune (MariaDB: its row locks, read by the locking reads
    that decide whether an operation is new, issue 23; SQLite: its write lock), then see the
    compact record: the answer of before the prune; so are the enqueues after it."""
    url, engine = business_db
    ns = secrets.token_hex(16)
    ops = _accepted_directly(engine, ns, 20)
    with engine.connect() as conn:
        queue = entries.get_row(conn, ns, ops[0]).queue_id
    marker = tmp_path / "prune-held"
    env = orbit_env(world.platform_url, url)
    proc = _prune_process(env, f"sender.prune.before_commit=hold:{marker}")

    def again(op: str, body: str) -> Any:
        with engine.begin() as conn:
            return enqueue(
                conn,
                namespace_id=ns,
                queue_id=queue,
                operation_id=op,
                request=body,
                source_ref=f"orders/{op[:8]}",
            )

    during: list[Any] = []
    conflicts: list[BaseException] = []

    def racing() -> None:
        during.extend(again(op, body_for(i)) for i, op in enumerate(ops))
        try:
            again(ops[0], '{"another": 1}')
        except OutboxConflict as exc:
            conflicts.append(exc)

    racer = threading.Thread(target=racing)
    try:
        _wait_for(marker, proc)
        racer.start()
        racer.join(1)
        assert racer.is_alive(), "an enqueue decided without waiting for the prune"
        assert not during and not conflicts
    finally:
        marker.unlink(missing_ok=True)
        out, err = proc.communicate(timeout=60)
        racer.join(60)
    assert proc.returncode == 0, err
    assert json.loads(out)["pruned"] == 20
    assert len(during) == 20 and len(conflicts) == 1
    after = [again(op, body_for(i)) for i, op in enumerate(ops)]
    with pytest.raises(OutboxConflict):
        again(ops[0], '{"another": 1}')
    for a, b in zip(during, after, strict=True):
        assert (a.created, a.state, b.created, b.state) == (False, "ACCEPTED", False, "ACCEPTED")
        assert (a.created_at, a.send_deadline_at) == (b.created_at, b.send_deadline_at)
    assert _nothing_half_done(engine, ns, ops) == 20


# --- the plan of a page, usage errors ------------------------------------------------------------


def test_page_scan_and_delete_are_primary_key_ranges_on_mariadb() -> None:
    """Every page statement of a prune (the keyset scan with its three joins, the fenced delete),
    with and without --namespace, reads a range of the primary key (EXPLAIN on MariaDB)."""
    with mariadb_database("orbit_sx") as url:
        engine = make_engine(url)
        try:
            upgrade(engine, "business")
            ns, other = secrets.token_hex(16), secrets.token_hex(16)
            _accepted_directly(engine, ns, 30)
            _accepted_directly(engine, other, 30)
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "ANALYZE TABLE sender_outbox, sender_jobs, sender_resolutions, "
                        "sender_pruned"
                    )
                )
            with captured_sql(engine) as seen, engine.connect() as conn:  # rolled back
                page = pruning.prune_scan(conn, ns, None, 10)
                assert pruning.delete_pruned(conn, ns, page)
                conn.rollback()
            deletes = [(st, pa) for st, pa in seen if st.startswith("DELETE FROM sender_outbox")]
            assert len(deletes) == 1
            # explained while its rows exist (on gone rows every plan costs nothing)
            plans = [(st, explain(engine, st, pa)) for st, pa in deletes]
            with captured_sql(engine) as seen:
                prune(engine, older_than_seconds=7 * 86400, namespace_id=ns, page_rows=10)
                prune(engine, older_than_seconds=7 * 86400, page_rows=10)
            scans = [(st, pa) for st, pa in seen if "LEFT OUTER JOIN sender_resolutions" in st]
            assert len(scans) >= 8
            assert any("sender_outbox.operation_id >" in st for st, _ in scans)  # the keyset
            _accepted_directly(engine, ns, 30)  # explained on rows too
            plans += [(st, explain(engine, st, pa)) for st, pa in scans]
            for statement, rows in plans:
                plan = {row["table"]: row for row in rows}
                outbox = plan["sender_outbox"]
                keyset = "operation_id >" in statement or statement.startswith("DELETE")
                # the first page of a namespace is a prefix (ref), of the table its start (index)
                kinds = ("range",) if keyset else ("range", "ref", "index")
                assert outbox["key"] == "PRIMARY" and outbox["type"] in kinds, (statement, plan)
                for joined in ("sender_jobs", "sender_resolutions", "sender_pruned"):
                    if joined in plan:
                        assert plan[joined]["type"] == "eq_ref", plan
                        assert plan[joined]["key"] == "PRIMARY", plan
        finally:
            engine.dispose()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        # issue 27: the one duration type of every option (click names the option)
        (["--older-than", "7 days"], "'--older-than': '7 days' is not a duration"),
        (["--older-than", "0s"], "'--older-than': 0s is out of range (allowed 1s..3650d)"),
        (["--older-than", "3651d"], "is out of range (allowed 1s..3650d)"),
        ([], "missing option '--older-than'"),
        # a bare number was taken as seconds: "7" meant as days pruned every row older than 7 s
        (["--older-than", "7"], "'--older-than': '7' is not a duration: the number needs a unit"),
        (["--older-than", "\uff17d"], "is not a duration"),  # fullwidth digits were accepted
        (["--older-than", "9" * 5000 + "d"], "is out of range (allowed 1s..3650d)"),  # ValueError
    ],
)
def test_bad_durations_are_one_line_exit_2_and_change_nothing(
    world: World, tmp_path: Path, args: list[str], line: str
) -> None:
    url = f"sqlite:///{tmp_path / 'business.sqlite3'}"
    engine = make_engine(url)
    upgrade(engine, "business")
    ns = secrets.token_hex(16)
    _accepted_directly(engine, ns, 3)
    before = _all_rows(engine)
    result = run_orbit(["sender", "prune", *args], orbit_env(world.platform_url, url))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert line in result.stderr and "Traceback" not in result.stderr
    assert _all_rows(engine) == before and not _pruned(engine)
    engine.dispose()


def test_dry_run_counts_what_the_prune_then_removes(world: World, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'business.sqlite3'}"
    engine = make_engine(url)
    upgrade(engine, "business")
    ns, other = secrets.token_hex(16), secrets.token_hex(16)
    _accepted_directly(engine, ns, 7)
    _accepted_directly(engine, other, 4)
    env = orbit_env(world.platform_url, url)
    before = _all_rows(engine)
    dry = run_orbit(["sender", "prune", "--older-than", "7d", "--namespace", ns, "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would prune 7 rows (7 ACCEPTED, 0 resolved REVIEW)")
    assert _all_rows(engine) == before
    assert json.loads(_prune_cli(env, "--namespace", ns).stdout)["pruned"] == 7
    assert {k[0] for k in _pruned(engine)} == {ns}
    assert json.loads(_prune_cli(env).stdout)["pruned"] == 4
    engine.dispose()


# --- ORBIT_SENDER_RETENTION: the same prune from a sender worker ----------------------------------


def test_retention_runs_from_a_sender_worker(
    world: World, business_db: tuple[str, Engine], workers: Workers, beat: Celery
) -> None:
    url, engine = business_db
    ns = secrets.token_hex(16)
    old = _accepted_directly(engine, ns, 30)
    young = _accepted_directly(engine, ns, 10)
    _backdate(engine, ns, young, dt.timedelta(hours=1))
    env = celery_env(
        url, world.platform_url, world.api.base_url, world.token, ORBIT_SENDER_RETENTION="7d"
    )
    schedule = subprocess.run(
        [
            str(REPO / ".venv/bin/python"),
            "-c",
            "import celeryconfig as c; print(c.beat_schedule['orbit-sender-prune'])",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "'task': 'orbit.sender.prune'" in schedule.stdout and "orbit.sender" in schedule.stdout
    off = subprocess.run(
        [
            str(REPO / ".venv/bin/python"),
            "-c",
            "import celeryconfig as c; print(sorted(c.beat_schedule))",
        ],
        env={k: v for k, v in env.items() if k != "ORBIT_SENDER_RETENTION"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert off.stdout.strip() == "['orbit-archive-tick', 'orbit-sender-tick']"  # off by default
    workers.start("sender-prune", env)
    beat.send_task("orbit.sender.prune", queue="orbit.sender")
    end = time.monotonic() + 60
    while len(_pruned(engine)) < len(old) and time.monotonic() < end:
        time.sleep(0.3)
    time.sleep(0.5)
    assert {k[1] for k in _pruned(engine)} == set(old)
    assert {k[1] for k in _all_rows(engine)} == set(young)
    assert "sender.prune.done" in workers.output()


# --- revision b0002 on a b0001 database ----------------------------------------------------------


@pytest.mark.parametrize("backend", ["mariadb", "sqlite"])
def test_sender_db_upgrade_from_b0001_with_rows(world: World, tmp_path: Path, backend: str) -> None:
    with mariadb_database("orbit_b1") if backend == "mariadb" else _sqlite_url(tmp_path) as url:
        engine = make_engine(url)
        cfg = alembic_config("business")
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "b0001")
        ns = secrets.token_hex(16)
        ops = [(secrets.token_hex(16), body_for(i)) for i in range(5)]
        _enqueue(engine, ns, secrets.token_hex(16), ops)  # b0001 only: nothing was ever pruned
        before = _all_rows(engine)
        env = orbit_env(world.platform_url, url)
        assert run_orbit(["sender", "db", "check"], env).returncode == 1  # b0001, not head
        done = run_orbit(["sender", "db", "upgrade", "--json"], env)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert (result["previous"], result["revision"], result["action"]) == (
            "b0001",
            "b0003",
            "upgraded",
        )
        assert _all_rows(engine) == before
        assert run_orbit(["sender", "db", "check"], env).returncode == 0
        _accepted_rows_of(engine, ns)
        assert json.loads(_prune_cli(env).stdout)["pruned"] == 5
        with engine.begin() as conn:
            entry = enqueue(
                conn,
                namespace_id=ns,
                queue_id=before[(ns, ops[0][0])][1],
                operation_id=ops[0][0],
                request=ops[0][1],
                source_ref=f"orders/{ops[0][0][:8]}",
            )
        assert (entry.created, entry.state) == (False, "ACCEPTED")
        engine.dispose()


class _sqlite_url:  # noqa: N801 - used like mariadb_database
    def __init__(self, tmp: Path) -> None:
        self.url = f"sqlite:///{tmp / 'b1.sqlite3'}"

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc: object) -> None:
        return None


def _accepted_rows_of(engine: Engine, ns: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(sender_outbox)
            .where(o.namespace_id == ns)
            .values(
                state="ACCEPTED",
                wake_at=None,
                last_code="ACCEPTED",
                task_id=o.operation_id,
                receipt_json="{}",
            )
        )
    with engine.connect() as conn:
        ops = [r[0] for r in conn.execute(select(o.operation_id).where(o.namespace_id == ns))]
    _backdate(engine, ns, ops)


def test_b0002_rendered_for_mysql8() -> None:
    ddl = render_sql("business", "mysql+mysqldb://u@h/x")
    part = ddl[
        ddl.index("-- Running upgrade b0001 -> b0002") : ddl.index("-- Running upgrade b0002")
    ]
    assert "CREATE TABLE sender_pruned (" in part and "CREATE TABLE sender_resolutions (" in part
    for column in (
        "namespace_id CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL",
        "request_digest BINARY(32) NOT NULL",
        "source_ref_digest BINARY(32) COMMENT",
        "pruned_at DATETIME(6) NOT NULL",
        "resolved_by VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_bin NOT NULL",
        "review_since DATETIME(6) NOT NULL",
        "PRIMARY KEY (namespace_id, operation_id)",
        "CONSTRAINT ck_sender_pruned_state CHECK",
        ")ENGINE=InnoDB",
    ):
        assert column in part, column
    assert "ALTER TABLE" not in part and "sender_outbox" not in part.split("UPDATE")[0]
    assert part.rstrip().endswith("WHERE sender_alembic_version.version_num = 'b0001';")


def test_schema_doc_carries_the_b0002_ddl() -> None:
    """docs/schema.md shows the DDL of b0002 for applications that own the sender tables: it is
    what the revision runs on MySQL 8 / MariaDB."""
    doc = (REPO / "docs" / "schema.md").read_text("utf-8")
    rendered = [
        "\n".join(
            line.rstrip()
            for line in str(st.compile(dialect=mysql.dialect()))
            .strip()
            .replace("\t", "    ")
            .splitlines()
        )
        + ";"
        for st in create_statements(b0002_tables.metadata)
    ]
    for statement in rendered:
        assert statement in doc, statement[:80]


def test_upgrade_refuses_half_of_b0002_created_by_hand(world: World, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'half.sqlite3'}"
    engine = make_engine(url)
    b0001_tables.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(next(iter(create_statements(b0002_tables.metadata, only=["sender_pruned"]))))
    engine.dispose()
    before = (tmp_path / "half.sqlite3").read_bytes()
    done = run_orbit(["sender", "db", "upgrade"], orbit_env(world.platform_url, url))
    assert done.returncode == 3, done.stderr
    assert "tables sender_pruned exist but sender_resolutions do not" in done.stderr
    assert "nothing was changed" in done.stderr
    assert (tmp_path / "half.sqlite3").read_bytes() == before


def test_two_prunes_at_once_prune_each_row_once(
    business_db: tuple[str, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """Two prunes over the same rows (two beats, or an operator beside beat): on MariaDB a page
    one of them read is deleted by the other meanwhile, its delete matches fewer rows and it
    falls back to row by row; every row is pruned exactly once, with one compact record."""
    _url, engine = business_db
    caplog.set_level("INFO", logger="orbit.sender.retention")
    ns = secrets.token_hex(16)
    ops = _accepted_directly(engine, ns, 1500)  # 30 pages each: the two runs overlap
    reports: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            reports.append(prune(engine, older_than_seconds=7 * 86400, page_rows=50))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    if _url.startswith("mysql"):  # consistent reads: pages overlap, and the fence saw it
        assert "sender.prune.page_changed" in caplog.text
    assert sum(r.total for r in reports) == len(ops)
    assert _nothing_half_done(engine, ns, ops) == len(ops)
