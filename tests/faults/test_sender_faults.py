"""HTTP faults between the sender and the real API, injected by a real proxy
(tests/support/sender_proxy.py): responses dropped after the platform committed, 5xx/429 with
Retry-After, timeouts after which the platform still commits, permanent refusals, and a key reused
with another body.

Oracle (SPEC §10): every row ends ACCEPTED or REVIEW, at most one platform task per key, and each
ACCEPTED row holds the platform's original receipt byte-exact."""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import threading

import pytest
from sqlalchemy import Engine, bindparam, select, text

from orbit_tasks.db.engine import db_now
from orbit_tasks.db.history_tables import tasks
from orbit_tasks.sender import enqueue, policy
from tests.support import sender as sender_support
from tests.support.cli import orbit_env, run_orbit
from tests.support.db import mariadb_database, migrated_engine
from tests.support.sender import (
    World,
    check_invariants,
    drive,
    enqueue_many,
    make_relay,
    new_op,
    platform_task_count,
    rows,
)
from tests.support.sender_proxy import PASS, Fault, fault_proxy

pytestmark = [pytest.mark.mariadb]

world = sender_support.world
business = sender_support.business


def test_response_dropped_after_the_platform_committed(
    world: World, business: tuple[str, Engine]
) -> None:
    _, engine = business
    ops = enqueue_many(engine, world.ns, world.queues, 12)

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        return Fault("drop_after") if method == "POST" and attempt == 1 else PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token)
        drive(relay, engine)
        relay.client.close()
    check_invariants(engine, world.platform, require_accepted=True)
    table = rows(engine)
    for op in ops:
        first, second = proxy.posts("op-" + op)
        assert (first.action, first.upstream_status) == ("drop_after", 201)  # committed, lost
        assert second.upstream_status == 200  # replay of the original receipt
        assert table[op][0].send_count == 2


def test_unavailable_throttled_and_retry_after(world: World, business: tuple[str, Engine]) -> None:
    _, engine = business
    # one row per queue: a 429's hold is per queue, and a row of the same queue claimed in the
    # same pass is released unsent while it lasts, which uses one of its sends (docs/sender.md);
    # with two rows a queue, send_count was 5 whenever one row's 429 came before the other's POST
    ops = enqueue_many(engine, world.ns, world.queues, len(world.queues))
    plan = {
        1: Fault("status", 500),
        2: Fault("status", 503, (("Retry-After", "0"),)),
        3: Fault("status", 429, (("Retry-After", "1"),)),
    }

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method != "POST" or attempt > 3:
            return PASS
        return plan[attempt]

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token)
        drive(relay, engine)
        relay.client.close()
    check_invariants(engine, world.platform, require_accepted=True)
    for op in ops:
        posts = proxy.posts("op-" + op)
        assert [p.action for p in posts] == ["status", "status", "status", "pass"]
        assert posts[3].at - posts[2].at >= 1.0  # Retry-After: 1 honoured
        assert rows(engine)[op][0].send_count == 4


def test_timeout_after_which_the_platform_commits(
    world: World, business: tuple[str, Engine]
) -> None:
    _, engine = business
    ops = enqueue_many(engine, world.ns, world.queues, 4)

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method == "POST" and attempt == 1:
            return Fault("sleep", seconds=1.5)  # beyond the client's 1 s read timeout
        return PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token, timeout=1.0)
        stats = relay.run_pass()
        assert stats.results == {"retry": 4}
        assert {r.last_code for r, _ in rows(engine).values()} == {"TIMEOUT"}
        drive(relay, engine)
        relay.client.close()
        proxy.settle()
    check_invariants(engine, world.platform, require_accepted=True)
    for op in ops:
        # Both reached the platform (the late one after the client gave up), in either order:
        # one created the task, the other was answered with the original receipt.
        statuses = sorted(p.upstream_status or 0 for p in proxy.posts("op-" + op))
        assert statuses == [200, 201]


def test_request_in_progress_and_unauthenticated_are_retried(
    world: World, business: tuple[str, Engine]
) -> None:
    _, engine = business
    ops = enqueue_many(engine, world.ns, world.queues[:1], 2)
    in_progress = b'{"error":"request_in_progress","message":"x"}'

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method == "POST" and attempt == 1:
            return Fault("status", 409, body=in_progress)
        if method == "POST" and attempt == 2:
            return Fault("status", 401)
        return PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token)
        drive(relay, engine)
        relay.client.close()
    check_invariants(engine, world.platform, require_accepted=True)
    for op in ops:
        assert [p.upstream_status for p in proxy.posts("op-" + op)] == [None, None, 201]
    # the 401 dropped the cached identity: it was fetched again
    assert len([s for s in proxy.seen if s.method == "GET"]) >= 2


STATUS_CODES = {
    400: "REJECTED",
    403: "FORBIDDEN",
    404: "QUEUE_NOT_FOUND",
    413: "TOO_LARGE",
    422: "REJECTED",
    200: "PROTOCOL",  # 200 whose body is not a receipt for this submission
    202: "PROTOCOL",
    301: "PROTOCOL",
}


def test_permanent_refusals_go_to_review_without_retry(
    world: World, business: tuple[str, Engine]
) -> None:
    _, engine = business
    ops = enqueue_many(engine, world.ns, world.queues[:1], len(STATUS_CODES))
    status_of = {"op-" + op: status for op, status in zip(ops, STATUS_CODES, strict=True)}

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method == "POST" and key is not None:
            return Fault("status", status_of[key])
        return PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token)
        drive(relay, engine)
        relay.client.close()
    table = rows(engine)
    for op, (status, code) in zip(ops, STATUS_CODES.items(), strict=True):
        r = table[op][0]
        assert (r.state, r.last_code, r.send_count) == ("REVIEW", code, 1), status
        assert len(proxy.posts("op-" + op)) == 1
    check_invariants(engine, world.platform)


def test_key_reused_with_another_body_is_a_conflict(world: World) -> None:
    """Two business databases (e.g. a restored backup) use one operation id for different
    requests: the platform keeps the first; the second goes to REVIEW IDEMPOTENCY_CONFLICT."""
    op = new_op()
    with (
        mariadb_database("orbit_sb") as url_a,
        migrated_engine(url_a, "business") as first,
        mariadb_database("orbit_sb") as url_b,
        migrated_engine(url_b, "business") as second,
    ):
        for engine, body in ((first, '{"v": 1}'), (second, '{"v": 2}')):
            with engine.begin() as conn:
                enqueue(
                    conn,
                    namespace_id=world.ns,
                    queue_id=world.queues[0],
                    operation_id=op,
                    request=body,
                    source_ref="r",
                )
            relay = make_relay(engine, world.api.base_url, world.token)
            drive(relay, engine)
            relay.client.close()
        assert rows(first)[op][0].state == "ACCEPTED"
        r = rows(second)[op][0]
        assert (r.state, r.last_code, r.send_count) == ("REVIEW", "IDEMPOTENCY_CONFLICT", 1)
        assert platform_task_count(world.platform, ["op-" + op]) == {"op-" + op: 1}
        check_invariants(first, world.platform)
        check_invariants(second, world.platform)


def test_retry_after_holds_the_whole_queue_and_only_that_queue(
    world: World, business: tuple[str, Engine]
) -> None:
    """Issue 17 item 4: a 429 with ``Retry-After: 2`` to one row of queue q0 holds every send to
    q0 in that sender process for 2 s (before, only that row waited and the rest of q0 kept
    hitting the platform); q1 keeps flowing meanwhile."""
    _, engine = business
    queues = world.queues[:2]
    ops = enqueue_many(engine, world.ns, queues, 40)
    q0 = {"op-" + op for op in ops[0::2]}  # enqueue_many assigns the queues in turn
    told: list[str] = []
    lock = threading.Lock()

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method != "POST" or key is None:
            return PASS
        with lock:
            if key in q0 and not told:
                told.append(key)
                return Fault("status", 429, (("Retry-After", "2"),))
        return Fault("sleep", seconds=0.1)  # sends take a while: q1's spread over the hold

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token, concurrency=4)
        drive(relay, engine)
        relay.client.close()
    check_invariants(engine, world.platform, require_accepted=True)
    posts = [p for p in proxy.posts() if p.method == "POST"]
    t429 = next(p.at for p in posts if p.action == "status")
    grace = 0.1  # a send already on its way when the 429 arrived
    during = [p for p in posts if t429 + grace < p.at < t429 + 2.0]
    assert not [p for p in during if p.key in q0], "a send to the held queue"
    assert [p for p in during if p.key not in q0], "the other queue stopped too"
    resumed = [p.at for p in posts if p.key in q0 and p.at > t429 + grace]
    assert resumed and min(resumed) >= t429 + 2.0  # q0 resumes once the 2 s are over


def _deadline_in(engine: Engine, ops: list[str], seconds: float) -> dt.datetime:
    """Make rows look enqueued almost 24 h ago: their deadline is ``seconds`` from now
    (created_at = deadline - 24 h satisfies ck_sender_deadline)."""
    with engine.begin() as conn:
        deadline = db_now(conn) + dt.timedelta(seconds=seconds)
        conn.execute(
            text(
                "UPDATE sender_outbox SET created_at=:c, send_deadline_at=:d, wake_at=:c "
                "WHERE operation_id IN :ops"
            ).bindparams(bindparam("ops", expanding=True)),
            {"c": deadline - dt.timedelta(hours=24), "d": deadline, "ops": ops},
        )
    return deadline


def test_deadlines_reached_during_a_slow_request(
    world: World, business: tuple[str, Engine]
) -> None:
    """Issue 23 item 3: with the API 3 s slow (under the 5 s HTTP bound), rows whose deadline was
    1.2-2.3 s away became platform tasks after ``send_deadline_at`` (a send started as long as
    1 s was left). A send starts only when the whole HTTP bound plus the margin fits before the
    deadline; the rest go to REVIEW DEADLINE_EXCEEDED unsent. Checked from the API's database:
    no task created at or after its row's deadline, one task per operation."""
    _, engine = business
    timeout = 5.0
    close = enqueue_many(engine, world.ns, world.queues, 12)  # 1.2..2.3 s left
    inside = enqueue_many(engine, world.ns, world.queues, 4)  # 4..5.5 s: < bound + margin
    far = enqueue_many(engine, world.ns, world.queues, 4)  # a day: sent, slowly
    for i, op in enumerate(close):
        _deadline_in(engine, [op], 1.2 + 0.1 * i)
    for i, op in enumerate(inside):
        _deadline_in(engine, [op], 4.0 + 0.5 * i)

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        return Fault("sleep", seconds=3.0) if method == "POST" else PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token, lease=60, timeout=timeout, concurrency=8)
        drive(relay, engine, timeout=60)
        relay.client.close()
        proxy.settle()
    table = rows(engine)
    sent_keys = {p.key for p in proxy.posts()}
    for op in close + inside:
        r = table[op][0]
        assert (r.state, r.last_code) == ("REVIEW", "DEADLINE_EXCEEDED"), (op, r.state)
        assert "op-" + op not in sent_keys, "a send started without the HTTP bound left"
    for op in far:
        assert table[op][0].state == "ACCEPTED"
    with world.platform.connect() as conn:
        created = {
            key: at
            for key, at in conn.execute(
                select(tasks.c.idempotency_key, tasks.c.created_at).where(
                    tasks.c.idempotency_key.in_(["op-" + op for op in close + inside + far])
                )
            )
        }
    assert set(created) == {"op-" + op for op in far}
    for op in far:
        assert created["op-" + op] < table[op][0].send_deadline_at
    assert set(platform_task_count(world.platform, list(created)).values()) == {1}
    check_invariants(engine, world.platform)


def _http_date(seconds_from_now: float) -> str:
    return email.utils.format_datetime(
        dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds_from_now), usegmt=True
    )


# (header, the hold it asks for in seconds: None = no hold)
RETRY_AFTER_KINDS = {
    "huge": ("99999999999999999999", policy.MAX_RETRY_AFTER_SECONDS),
    "400_digits": ("9" * 400, policy.MAX_RETRY_AFTER_SECONDS),
    "year_9999": ("Fri, 31 Dec 9999 23:59:59 GMT", policy.MAX_RETRY_AFTER_SECONDS),
    "negative": ("-5", None),
    "fractional": ("1.5", None),
    "empty": ("", None),
    "garbage": ("soon, maybe", None),
    "date_past": ("Thu, 01 Jan 2004 00:00:00 GMT", None),
    "zero": ("0", None),
    "date_future": ("<in 2 s>", 2.0),
    "small": ("2", 2.0),
    "padded": ("  2  ", 2.0),
}


@pytest.mark.parametrize("kind", sorted(RETRY_AFTER_KINDS))
def test_every_retry_after_is_bounded_and_never_freezes_the_queue(
    world: World, business: tuple[str, Engine], kind: str
) -> None:
    """Issue 23 item 4: ``Retry-After: 99999999999999999999`` (or 400 digits) on a 429 sent that
    row to REVIEW at once and held its queue for the life of the process (later rows PENDING,
    send_count 0). Now every value is bounded before use (600 s at most), the hold ends at the
    last retry slot of the queue's earliest deadline at the latest, it is recorded in
    sender_holds, and every row is still sent before its deadline."""
    url, engine = business
    header, asked = RETRY_AFTER_KINDS[kind]
    if header == "<in 2 s>":
        header = _http_date(2.5)
    timeout = 1.0
    ops = enqueue_many(engine, world.ns, world.queues[:1], 6)
    deadline = _deadline_in(engine, ops, 10.0)
    told: list[str] = []
    lock = threading.Lock()

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        with lock:
            if method == "POST" and not told:
                told.append(str(key))
                return Fault("status", 429, (("Retry-After", header),))
        return PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token, lease=10, timeout=timeout)
        drive(relay, engine, timeout=40, pause=0.1)
        relay.client.close()
        proxy.settle()
    table = rows(engine)
    for op in ops:  # the hold never took a try away: no REVIEW, the queue did not freeze
        r = table[op][0]
        assert (r.state, r.last_code) == ("ACCEPTED", "ACCEPTED"), (kind, op, r.last_code)
    assert table[told[0][3:]][0].send_count == 2
    with engine.connect() as conn:
        hold = conn.execute(text("SELECT * FROM sender_holds")).first()
    if asked is None:
        assert hold is None, hold
    else:
        assert hold is not None and hold.status == 429
        assert abs(hold.asked_seconds - asked) <= 1
        last_slot = policy.last_slot(deadline, timeout)
        assert hold.held_until <= last_slot  # bounded by the earliest deadline
        assert hold.held_until <= hold.set_at + dt.timedelta(seconds=asked + 1)
        t429 = next(p.at for p in proxy.posts() if p.action == "status")
        end = hold.held_until.replace(tzinfo=dt.UTC).timestamp()
        during = [p for p in proxy.posts() if t429 + 0.1 < p.at < end - 0.05]
        assert not during, "a send to the held queue"
    with world.platform.connect() as conn:
        created = dict(
            conn.execute(
                select(tasks.c.idempotency_key, tasks.c.created_at).where(
                    tasks.c.idempotency_key.in_(["op-" + op for op in ops])
                )
            ).all()
        )
    assert len(created) == len(ops) and all(at < deadline for at in created.values())
    check_invariants(engine, world.platform, require_accepted=True)


def test_a_hold_is_honoured_by_every_sender_process_and_shown(
    world: World, business: tuple[str, Engine]
) -> None:
    """The hold lives in the business database: a second sender (another process: no memory of
    the answer) claims nothing of the held queue until it ends; ``sender show`` names it."""
    url, engine = business
    ops = enqueue_many(engine, world.ns, world.queues[:1], 4)
    told: list[str] = []

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method == "POST" and not told:
            told.append(str(key))
            return Fault("status", 503, (("Retry-After", "4"),))
        return PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        first = make_relay(engine, proxy.url, world.token, lease=10, timeout=1.0, concurrency=1)
        first.run_pass(max_claims=1, budget_seconds=2.0)
        first.client.close()
        assert told and rows(engine)[told[0][3:]][0].last_code == "UNAVAILABLE"
        second = make_relay(engine, proxy.url, world.token, lease=10, timeout=1.0)
        stats = second.run_pass(budget_seconds=1.0)
        assert stats.claimed == 0, stats  # held for every process, not only the one told
        shown = run_orbit(
            ["sender", "show", world.ns, ops[1], "--json"], orbit_env(world.platform_url, url)
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["queue_held_until"] is not None
        listed = run_orbit(["sender", "list", "--json"], orbit_env(world.platform_url, url))
        assert listed.returncode == 0, listed.stderr
        held = {
            i["operation_id"]: i["queue_held_until"] for i in json.loads(listed.stdout)["items"]
        }
        assert (
            held[ops[1]] is not None
            and held[ops[1]] == json.loads(shown.stdout)["queue_held_until"]
        )
        drive(second, engine, timeout=30, pause=0.2)
        second.client.close()
    check_invariants(engine, world.platform, require_accepted=True)
    with engine.connect() as conn:
        hold = conn.execute(text("SELECT * FROM sender_holds")).one()
    t503 = next(p.at for p in proxy.posts() if p.action == "status")
    resumed = min(p.at for p in proxy.posts() if p.action != "status")
    assert resumed >= hold.held_until.replace(tzinfo=dt.UTC).timestamp() - 0.05
    assert resumed >= t503 + 3.5
