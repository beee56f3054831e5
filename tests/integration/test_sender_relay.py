"""Relay passes in-process against the real API subprocess and MariaDB: acceptance, fencing of a
stale sender, credential swap, tampered body, deadline and attempt guards, forbidden queues,
and that the token never reaches logs or the business database."""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.db.engine import db_now
from orbit_tasks.platform.store import TOKEN_PREFIX
from orbit_tasks.sender import policy
from orbit_tasks.sender.store import dead_letters, entries
from tests.support import sender as sender_support
from tests.support.db import migrated_engine
from tests.support.sender import (
    ShiftedClock,
    World,
    check_invariants,
    drive,
    enqueue_many,
    make_relay,
    platform_receipts,
    platform_task_count,
    rows,
    shift_clock,
)
from tests.support.sender_proxy import PASS, Fault, fault_proxy

pytestmark = [pytest.mark.mariadb]

world = sender_support.world  # module fixture: platform database + API subprocess
business = sender_support.business  # per-test business database


def test_relay_accepts_every_row_once(world: World, business: tuple[str, Engine]) -> None:
    _, engine = business
    ops = enqueue_many(engine, world.ns, world.queues, 40)
    relay = make_relay(engine, world.api.base_url, world.token)
    stats = relay.run_pass()
    assert stats.claimed == 40 and stats.results == {"accepted": 40}
    assert check_invariants(engine, world.platform, require_accepted=True) == {"ACCEPTED": 40}
    table = rows(engine)
    assert all(table[op][0].send_count == 1 for op in ops)
    # A second pass finds nothing to do and sends nothing.
    assert relay.run_pass().claimed == 0
    relay.client.close()


def test_stale_sender_outcome_is_dropped(
    world: World, business: tuple[str, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    _, engine = business
    (op_a, op_b) = enqueue_many(engine, world.ns, world.queues[:1], 2)
    old = make_relay(engine, world.api.base_url, world.token, lease=10)
    # The new sender's clock is past the old one's lease: it may take the rows over.
    new = make_relay(engine, world.api.base_url, world.token, lease=10, clock=shift_clock(11))
    identity = old.client.identity()
    owned_old, _, _ = old.claim_batch(identity, 10)
    owned_new, _, _ = new.claim_batch(identity, 10)
    assert [o.row.lease_epoch for o in owned_old] == [1, 1]
    assert [o.row.lease_epoch for o in owned_new] == [2, 2]
    old_by_op = {o.row.operation_id: o for o in owned_old}
    new_by_op = {o.row.operation_id: o for o in owned_new}
    caplog.set_level(logging.INFO, logger="orbit.sender")
    # op_a: the old sender finishes first (its POST is accepted) -> its write is dropped, the new
    # sender's replay records the original receipt.
    assert old.process(old_by_op[op_a]) == "stale"
    assert rows(engine)[op_a][0].state == "SENDING"
    assert new.process(new_by_op[op_a]) == "accepted"
    # op_b: the new sender finishes first; the old result arrives late and changes nothing.
    assert new.process(new_by_op[op_b]) == "accepted"
    before = rows(engine)[op_b][0]
    assert old.process(old_by_op[op_b]) == "stale"
    assert rows(engine)[op_b][0] == before
    assert sum("sender.outcome.stale" in r.getMessage() for r in caplog.records) == 2
    table = rows(engine)
    assert all(table[op][0].lease_epoch == 2 for op in (op_a, op_b))
    assert check_invariants(engine, world.platform, require_accepted=True)
    old.client.close()
    new.client.close()


def test_credential_of_another_namespace_never_sends_these_rows(
    world: World, business: tuple[str, Engine]
) -> None:
    _, engine = business
    mine = enqueue_many(engine, world.ns, world.queues, 6)
    theirs = enqueue_many(engine, world.other_ns, [world.other_queue], 3)
    # In flight: claimed under the right credential, then the process's credential is swapped.
    right = make_relay(engine, world.api.base_url, world.token)
    owned, _, _ = right.claim_batch(right.client.identity(), 2)
    swapped = make_relay(engine, world.api.base_url, world.other_token)
    assert [swapped.process(o) for o in owned] == ["released", "released"]
    # A whole pass with the other namespace's credential sends only that namespace's rows.
    stats = swapped.run_pass()
    assert stats.results == {"accepted": 3}
    table = rows(engine)
    for op in mine:
        r = table[op][0]
        assert r.state == "PENDING" and r.last_code == "NEW" and r.task_id is None
    assert {table[o.row.operation_id][0].send_count for o in owned} == {1}
    keys = ["op-" + op for op in mine]
    assert platform_task_count(world.platform, keys) == {}
    assert all(table[op][0].state == "ACCEPTED" for op in theirs)
    # The right credential later sends them, each once.
    assert drive(right, engine) >= 1
    assert check_invariants(engine, world.platform, require_accepted=True)
    right.client.close()
    swapped.client.close()


def test_queue_not_allowed(world: World, business: tuple[str, Engine]) -> None:
    _, engine = business
    ops = enqueue_many(engine, world.ns, world.queues[:2], 4)  # q0, q1, q0, q1
    everything = make_relay(engine, world.api.base_url, world.token)
    only_q0 = make_relay(engine, world.api.base_url, world.token_q0)
    # SPEC §8 step 3: a row whose queue the credential does not allow is claimed (it belongs to
    # the credential's namespace) and goes to REVIEW QUEUE_FORBIDDEN without being sent.
    assert only_q0.run_pass().results == {"accepted": 2, "review": 2}
    table = rows(engine)
    assert [table[op][0].state for op in ops] == ["ACCEPTED", "REVIEW", "ACCEPTED", "REVIEW"]
    assert {table[op][0].last_code for op in ops[1::2]} == {"QUEUE_FORBIDDEN"}
    assert {table[op][0].send_count for op in ops[1::2]} == {1}
    assert platform_task_count(world.platform, ["op-" + op for op in ops[1::2]]) == {}
    # After the operator grants the queue, requeue sends them under the same key.
    with engine.begin() as conn:
        for op in ops[1::2]:
            row = entries.get_row(conn, world.ns, op)
            assert dead_letters.requeue(conn, row, db_now(conn))
    assert everything.run_pass().results == {"accepted": 2}
    # Claimed under a wider identity, checked against the current one before sending.
    more = enqueue_many(engine, world.ns, world.queues[1:2], 2)
    owned, _, _ = everything.claim_batch(everything.client.identity(), 10)
    assert len(owned) == 2
    assert [only_q0.process(o) for o in owned] == ["review", "review"]
    table = rows(engine)
    assert {table[op][0].last_code for op in more} == {"QUEUE_FORBIDDEN"}
    check_invariants(engine, world.platform, require_accepted=False)
    everything.client.close()
    only_q0.client.close()


def test_tampered_body_is_never_sent(world: World, business: tuple[str, Engine]) -> None:
    _, engine = business
    op, ok = enqueue_many(engine, world.ns, world.queues[:1], 2)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sender_outbox SET request_json = '{\"tampered\": true}' "
                "WHERE operation_id=:op"
            ),
            {"op": op},
        )
    relay = make_relay(engine, world.api.base_url, world.token)
    assert relay.run_pass().results == {"review": 1, "accepted": 1}
    r = rows(engine)[op][0]
    assert (r.state, r.last_code) == ("REVIEW", "DIGEST_MISMATCH")
    assert platform_task_count(world.platform, ["op-" + op]) == {}
    assert check_invariants(engine, world.platform) == {"ACCEPTED": 1, "REVIEW": 1}
    relay.client.close()


def test_row_with_a_changed_key_is_never_sent(world: World, business: tuple[str, Engine]) -> None:
    """The key is frozen ("op-" + operation id): a row whose key was changed in the database
    (e.g. someone "fixing" a REVIEW row by re-keying it) is never sent under the new key, which
    could create a second task for one operation."""
    _, engine = business
    op, ok = enqueue_many(engine, world.ns, world.queues[:1], 2)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sender_outbox SET idempotency_key='op-rekeyed' WHERE operation_id=:op"),
            {"op": op},
        )
    relay = make_relay(engine, world.api.base_url, world.token)
    assert relay.run_pass().results == {"review": 1, "accepted": 1}
    r = rows(engine)[op][0]
    assert (r.state, r.last_code) == ("REVIEW", "DIGEST_MISMATCH")
    assert platform_task_count(world.platform, ["op-rekeyed", "op-" + op]) == {}
    assert rows(engine)[ok][0].state == "ACCEPTED"
    relay.client.close()


def _age(engine: Engine, ops: list[str], deadline_in: float) -> dt.datetime:
    """Make rows look enqueued almost 24 h ago: deadline ``deadline_in`` seconds from now
    (created_at = deadline - 24 h satisfies ck_sender_deadline)."""
    with engine.begin() as conn:
        deadline = db_now(conn) + dt.timedelta(seconds=deadline_in)
        for op in ops:
            conn.execute(
                text(
                    "UPDATE sender_outbox SET created_at=:c, send_deadline_at=:d, wake_at=:c "
                    "WHERE operation_id=:op"
                ),
                {"c": deadline - dt.timedelta(hours=24), "d": deadline, "op": op},
            )
    return deadline


def test_platform_unreachable_until_the_deadline(
    world: World, business: tuple[str, Engine]
) -> None:
    _, engine = business
    ops = enqueue_many(engine, world.ns, world.queues, 4)

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        return Fault("drop_before") if method == "POST" else PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        deadline = _age(engine, ops, 5.0)
        relay = make_relay(engine, proxy.url, world.token, timeout=1.0)
        drive(relay, engine, timeout=30)
        relay.client.close()
    table = rows(engine)
    for op in ops:
        r = table[op][0]
        assert (r.state, r.last_code) == ("REVIEW", "DEADLINE_EXCEEDED"), r
        assert r.send_count >= 1
    assert max(table[op][0].send_count for op in ops) >= 2  # retried (NETWORK) while in time
    deadline_epoch = deadline.replace(tzinfo=dt.UTC).timestamp()
    posts = proxy.posts()
    # No send starts in the last LAST_SEND_MARGIN, so none reaches the platform after the deadline.
    assert posts and all(p.at < deadline_epoch for p in posts)
    assert platform_task_count(world.platform, ["op-" + op for op in ops]) == {}
    check_invariants(engine, world.platform)


def test_deadline_sweep_without_any_sender(world: World, business: tuple[str, Engine]) -> None:
    """Rows no credential can claim (platform down) still reach REVIEW at their deadline."""
    _, engine = business
    ops = enqueue_many(engine, world.other_ns, [world.other_queue], 2)
    _age(engine, ops, -1.0)
    relay = make_relay(engine, "http://127.0.0.1:9", world.token, timeout=0.5)  # nothing listens
    stats = relay.run_pass()
    assert stats.identity_error and stats.swept == 2 and stats.claimed == 0
    assert {r.last_code for r, _ in rows(engine).values()} == {"DEADLINE_EXCEEDED"}
    relay.client.close()


def test_attempts_are_bounded_at_100(world: World, business: tuple[str, Engine]) -> None:
    _, engine = business
    op99, op100 = enqueue_many(engine, world.ns, world.queues[:1], 2)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sender_outbox SET send_count=99, lease_epoch=99 WHERE operation_id=:o"),
            {"o": op99},
        )
        conn.execute(
            text("UPDATE sender_outbox SET send_count=100, lease_epoch=100 WHERE operation_id=:o"),
            {"o": op100},
        )

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        return Fault("status", 503) if method == "POST" else PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token)
        drive(relay, engine, timeout=20)
        relay.client.close()
    table = rows(engine)
    assert (table[op100][0].state, table[op100][0].last_code) == ("REVIEW", "ATTEMPTS_EXHAUSTED")
    assert table[op100][0].send_count == 100
    assert (table[op99][0].state, table[op99][0].last_code) == ("REVIEW", "ATTEMPTS_EXHAUSTED")
    assert table[op99][0].send_count == 100
    assert len(proxy.posts("op-" + op99)) == 1 and proxy.posts("op-" + op100) == []
    check_invariants(engine, world.platform)


def test_token_never_reaches_logs_or_the_business_database(
    world: World, business: tuple[str, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    _, engine = business
    caplog.set_level(logging.DEBUG)  # every logger, httpx/httpcore included
    enqueue_many(engine, world.ns, world.queues, 6)
    statuses = iter([401, 403, 500, 429])

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method == "POST" and attempt == 1:
            status = next(statuses, 0)
            if status:
                return Fault("status", status, (("Retry-After", "0"),))
        return PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token)
        drive(relay, engine, timeout=30)
        assert "token" not in repr(relay.client).lower() and world.token not in repr(relay.client)
        relay.client.close()
    states = check_invariants(engine, world.platform)
    assert states == {"ACCEPTED": 5, "REVIEW": 1}  # the 403 is a REVIEW FORBIDDEN
    text_logs = "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert "sender.row.accepted" in text_logs
    assert world.token not in text_logs
    # 12 characters of the secret itself (the urlsafe secret may hold "_": splitting on it left
    # a tail as short as one letter, found in any log)
    assert world.token[len(TOKEN_PREFIX) :][:12] not in text_logs
    assert "😀" not in text_logs  # request bodies are not logged either
    with engine.connect() as conn:
        dump = repr(conn.execute(text("SELECT * FROM sender_outbox")).all())
        dump += repr(conn.execute(text("SELECT * FROM sender_jobs")).all())
    assert world.token not in dump
    assert world.token not in world.api.output()
    for r, _ in rows(engine).values():
        assert r.last_code in policy.ALL_CODES
    receipts = platform_receipts(world.platform, world.ns)
    assert all(world.token not in rec for _, rec in receipts.values())


def test_relay_on_the_embedded_sqlite_business_database(world: World, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'business.sqlite3'}"
    with migrated_engine(url, "business") as engine:
        ops = enqueue_many(engine, world.ns, world.queues, 10)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE sender_outbox SET request_json='{}' WHERE operation_id=:op"),
                {"op": ops[0]},
            )
        relay = make_relay(engine, world.api.base_url, world.token)
        drive(relay, engine)
        relay.client.close()
        assert check_invariants(engine, world.platform) == {"ACCEPTED": 9, "REVIEW": 1}
        assert rows(engine)[ops[0]][0].last_code == "DIGEST_MISMATCH"


def test_lost_identity_mid_pass_stops_claiming(world: World, business: tuple[str, Engine]) -> None:
    """A 401 in the middle of a pass (token revoked) drops the cached identity; the next refresh
    fails. The pass must stop claiming then, not claim-release the same rows again and again
    (each claim is one of the row's 100 sends)."""
    _, engine = business
    revoked = {"now": False}

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if revoked["now"]:
            return Fault("status", 401, body=b'{"error":"unauthenticated","message":"x"}')
        return PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token, concurrency=1)
        relay.client.identity()  # cached, as in a long-running worker
        ops = enqueue_many(engine, world.ns, world.queues[:1], 4)
        revoked["now"] = True
        stats = relay.run_pass(budget_seconds=3.0)
        relay.client.close()
    table = rows(engine)
    assert stats.identity_error
    assert stats.claimed <= len(ops), stats  # each row claimed at most once: no claim-release loop
    for op in ops:
        r = table[op][0]
        assert r.state == "PENDING" and r.send_count <= 1, (r.state, r.send_count, r.last_code)
    assert len(proxy.posts()) == 1  # only the row sent before the 401 was seen


def test_claim_just_before_the_deadline_is_not_sent_after_it(
    world: World, business: tuple[str, Engine]
) -> None:
    """The deadline check before the POST measures the time since the database clock was read for
    the claim, not since the claim transaction returned: a slow claim transaction (lock waits,
    commit latency; simulated by a clock read followed by a pause) must not let a row claimed just
    before its deadline be sent after it."""
    _, engine = business
    (op,) = enqueue_many(engine, world.ns, world.queues[:1], 1)

    class SlowClock(ShiftedClock):
        def now(self, conn: Any) -> dt.datetime:
            now = super().now(conn)
            time.sleep(0.6)  # the rest of the transaction takes this long
            return now

    relay = make_relay(engine, world.api.base_url, world.token, clock=SlowClock(0))
    identity = relay.client.identity()
    # claimable: the HTTP bound (2 s) and the margin (1 s) fit, with 0.3 s to spare
    deadline = _age(engine, [op], 2.0 + 1.0 + 0.3)
    owned, _, _ = relay.claim_batch(identity, 10)
    assert [o.row.claimed_at < deadline for o in owned] == [True]  # claimed before it
    assert relay.process(owned[0]) == "review"
    r = rows(engine)[op][0]
    assert (r.state, r.last_code) == ("REVIEW", "DEADLINE_EXCEEDED")
    assert platform_task_count(world.platform, ["op-" + op]) == {}
    relay.client.close()


def test_unreadable_identity_answer_is_identity_unavailable(
    world: World, business: tuple[str, Engine]
) -> None:
    """A 200 from GET /v1/credential whose body the parser cannot take (nested past the
    recursion limit) is "identity unavailable", not an exception out of the pass."""
    _, engine = business
    enqueue_many(engine, world.ns, world.queues[:1], 1)
    deep = b"[" * 100_000 + b"]" * 100_000

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        return Fault("status", 200, body=deep) if method == "GET" else PASS

    with fault_proxy(world.api.base_url, rule) as proxy:
        relay = make_relay(engine, proxy.url, world.token)
        stats = relay.run_pass()
        relay.client.close()
    assert stats.identity_error and stats.claimed == 0
    assert proxy.posts() == []
