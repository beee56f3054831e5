"""One beat leader (issue 30 item 3), with real ``orbit beat`` processes: two beats, exactly one
publishes; the leader SIGKILLed, then cut off from the database by the network — the standby's
ticks follow within one tick period, and two beats never publish in the same period.

Each beat logs JSON (``ORBIT_LOG_FORMAT=json``): ``beat.leader.leading`` / ``standby`` /
``lost`` and Celery's "Sending due task" lines, with their times, are what the tests read."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, create_engine, text

from orbit_tasks.beat import store
from orbit_tasks.db.engine import DB_CLOCK
from tests.support import netns
from tests.support.archive_jobs import ORBIT, REPO, wait_for
from tests.support.db import migrated_engine, redis_url

PERIOD = 4  # ORBIT_TICK_SECONDS: the lease is 3 s, watched every 0.75 s
SLACK = 1.5  # process scheduling on a loaded 2-core machine


class Beat:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.name, self.proc, self.log = name, proc, log

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def actions(self, action: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("action") == action]

    def sends(self) -> list[dt.datetime]:
        """Times of the ticks this beat sent."""
        return [_ts(r) for r in self.records() if "Sending due task" in str(r.get("message", ""))]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


def _ts(record: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(str(record["ts"]).replace("Z", "+00:00"))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@contextmanager
def beats(tmp: Path, env: dict[str, str]) -> Iterator[Any]:
    started: list[Beat] = []

    def start(name: str, *, prefix: list[str] | None = None, **extra: str) -> Beat:
        e = {**env, "ORBIT_VAR_DIR": str(tmp / f"var-{name}"), **extra}
        log = tmp / f"beat-{name}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [*(prefix or []), ORBIT, "beat", "-l", "INFO"], cwd=REPO, env=e, stdout=fh,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        b = Beat(name, proc, log)
        started.append(b)
        return b

    try:
        yield start
    finally:
        for b in started:
            b.kill()
            with suppress(subprocess.TimeoutExpired):
                b.proc.wait(timeout=10)


def _env(url: str, broker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(
        ORBIT_DATABASE_URL=url,  # archive ticks only: no sender database named
        CELERY_BROKER_URL=broker,
        ORBIT_TICK_SECONDS=str(PERIOD),
        ORBIT_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    return env


def _leader(engine: Engine) -> store.Leader:
    with engine.connect() as conn:
        row = store.read(conn, DB_CLOCK)
    assert row is not None
    return row


def _wait_action(b: Beat, action: str, timeout: float = 40) -> dict[str, Any]:
    def seen() -> Any:
        assert b.proc.poll() is None or action == "", b.log.read_text(errors="replace")[-3000:]
        found = b.actions(action)
        return found[0] if found else None

    return wait_for(seen, timeout, f"{b.name}: {action}")  # type: ignore[no-any-return]


def _assert_one_publisher_per_period(first: Beat, second: Beat) -> None:
    """Never two leaders publishing in the same period: every send of the second beat comes
    after the last send of the first (the first only published before the hand-over)."""
    a, b = first.sends(), second.sends()
    if a and b:
        assert max(a) < min(b), (a, b)


@pytest.mark.mariadb
def test_two_beats_one_leader_and_the_standby_takes_over_a_killed_leader(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    broker = redis_url(6)
    redis.Redis.from_url(broker).flushdb()
    with beats(tmp_path, _env(mariadb_url, broker)) as start:
        a = start("a")
        _wait_action(a, "beat.leader.leading")
        b = start("b")
        standby = _wait_action(b, "beat.leader.standby")
        assert standby["leader"] == _leader(platform_engine).holder  # names who leads
        time.sleep(3 * PERIOD)
        assert len(a.sends()) >= 2, a.log.read_text()[-3000:]
        assert b.sends() == []  # the standby published nothing
        assert _leader(platform_engine).last_tick_at is not None

        a.kill()
        killed = _now()
        _wait_action(b, "beat.leader.leading", timeout=4 * PERIOD)
        wait_for(lambda: b.sends(), 4 * PERIOD, "the standby's first tick")
        gap = (min(b.sends()) - killed).total_seconds()
        print(f"first tick of the new leader {gap:.2f} s after the leader's SIGKILL")
        assert gap <= PERIOD + SLACK, gap
        _assert_one_publisher_per_period(a, b)
        lead = _leader(platform_engine)
        assert lead.epoch == 2 and lead.holder.endswith(f":{b.proc.pid}"), lead
    redis.Redis.from_url(broker).flushdb()


@pytest.mark.mariadb
def test_a_stopped_leader_hands_over_at_once(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """SIGTERM: the leader resigns its lease as it stops; the standby leads at its next look."""
    broker = redis_url(6)
    with beats(tmp_path, _env(mariadb_url, broker)) as start:
        a = start("a")
        _wait_action(a, "beat.leader.leading")
        b = start("b")
        _wait_action(b, "beat.leader.standby")
        a.kill(signal.SIGTERM)
        stopped = _now()
        _wait_action(a, "beat.leader.resigned", timeout=20)
        took = _wait_action(b, "beat.leader.leading", timeout=4 * PERIOD)
        assert (_ts(took) - stopped).total_seconds() <= 1.5 + SLACK
    redis.Redis.from_url(broker).flushdb()


def test_a_leader_cut_off_from_the_database_stops_and_the_standby_takes_over(
    tmp_path: Path,
) -> None:
    """The leader runs in a network namespace; its packets to the database are dropped (the
    broker still answers, so it *could* publish): it stops publishing before its lease ends,
    the standby takes over within one period, and after healing the old leader stands by."""
    netns.require_tools()
    with ExitStack() as stack:
        db_port = stack.enter_context(netns.private_mariadb())
        redis_port = stack.enter_context(netns.private_redis())
        (host,) = stack.enter_context(netns.hosts(1))
        admin = create_engine(f"mysql+mysqldb://root@127.0.0.1:{db_port}/mysql")
        with admin.begin() as conn:
            conn.execute(text("CREATE DATABASE orbit CHARACTER SET utf8mb4"))
        admin.dispose()
        url = f"mysql+mysqldb://root@127.0.0.1:{db_port}/orbit"
        engine = stack.enter_context(migrated_engine(url, "platform"))
        env = _env(url, f"redis://127.0.0.1:{redis_port}/0")
        start = stack.enter_context(beats(tmp_path, env))
        a = start(
            "a",
            prefix=host.prefix,
            ORBIT_DATABASE_URL=f"mysql+mysqldb://root@{host.host_ip}:{db_port}/orbit",
            CELERY_BROKER_URL=f"redis://{host.host_ip}:{redis_port}/0",
        )
        _wait_action(a, "beat.leader.leading")
        b = start("b")
        _wait_action(b, "beat.leader.standby")
        wait_for(lambda: len(a.sends()) >= 2, 4 * PERIOD, "the leader's ticks")

        subprocess.run(
            [*host.prefix, "iptables", "-A", "OUTPUT", "-p", "tcp", "--dport", str(db_port),
             "-j", "DROP"],
            check=True, timeout=30,
        )  # fmt: skip
        cut = _now()
        _wait_action(b, "beat.leader.leading", timeout=4 * PERIOD)
        wait_for(lambda: b.sends(), 4 * PERIOD, "the standby's first tick")
        gap = (min(b.sends()) - cut).total_seconds()
        print(f"first tick of the new leader {gap:.2f} s after the cut")
        assert gap <= PERIOD + SLACK, gap
        _wait_action(a, "beat.leader.lost", timeout=4 * PERIOD)
        _assert_one_publisher_per_period(a, b)

        host.heal()
        time.sleep(2 * PERIOD)
        assert a.proc.poll() is None
        _assert_one_publisher_per_period(a, b)  # healed, the old leader stays a standby
        assert _leader(engine).holder.endswith(f":{b.proc.pid}")
