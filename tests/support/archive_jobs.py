"""Shared helpers of the archive job tests: real MariaDB, real Redis (db 2), real volume
directories and real ``orbit worker archive`` (= ``celery worker``) subprocesses."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Engine, select, update

from orbit_tasks.archive.engine.storage import Storage, open_storage
from orbit_tasks.archive.engine.verify import export_roots, verify_job_dir
from orbit_tasks.archive.engine.volume import job_dir, write_identity
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.store import source
from orbit_tasks.archive.tick import TickReport, run_tick
from orbit_tasks.archive.wakeups import make_publisher
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans
from orbit_tasks.dev import generator
from orbit_tasks.ids import new_id
from orbit_tasks.platform import store
from orbit_tasks.queues import is_amqp
from orbit_tasks.settings import Settings, load_settings
from tests.support.db import redis_url

REPO = Path(__file__).resolve().parents[2]
ORBIT = str(REPO / ".venv" / "bin" / "orbit")
REDIS_URL = redis_url(2)
LEASE = 6
SLICE = 2
MiB = 1024 * 1024


@dataclass
class ArchiveEnv:
    url: str
    engine: Engine
    tmp: Path
    env: dict[str, str]
    settings: Settings
    app: Celery
    workers: list[Worker] = field(default_factory=list)

    def publish(self, storage_id: bytes, ns_id: bytes, job_id: bytes, *, kind: str = "") -> None:
        make_publisher(self.app)(storage_id, ns_id, job_id, kind=kind)

    def tick(self) -> TickReport:
        return run_tick(self.engine, self.settings, publish=make_publisher(self.app))

    def orbit(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [ORBIT, *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=60
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"orbit {args} -> {proc.returncode}: {proc.stderr}")
        return proc

    def worker(
        self,
        name: str,
        volumes: list[Path] | list[Path | str],
        *,
        failpoints: str | None = None,
        pool: str = "prefork",
        extra_env: dict[str, str] | None = None,
        wait_ready: bool = True,
        control: bool = False,
        prefix: list[str] | None = None,
    ) -> Worker:
        """``orbit worker archive`` on ``volumes`` (``orbit worker control`` when ``volumes`` is
        empty); ``prefix``: a command the worker runs under (``ip netns exec NS``)."""
        env = dict(self.env)
        if failpoints:
            env["ORBIT_FAILPOINTS"] = failpoints
        env.update(extra_env or {})
        if volumes:
            args = [ORBIT, "worker", "archive", "-c", "1", "--pool", pool]
            args += [] if control else ["--no-control"]
            for v in volumes:
                args += ["--volume", str(v)]
        else:
            args = [ORBIT, "worker", "control", "-c", "1", "--pool", pool]
        args += ["-n", f"{name}-{os.getpid()}@test", "-l", "INFO"]
        args += ["--", "--without-mingle", "--without-gossip", "--without-heartbeat"]
        log = self.tmp / f"worker-{name}.log"
        fh = open(log, "wb")  # noqa: SIM115 - closed in Worker.stop
        proc = subprocess.Popen(
            [*(prefix or []), *args],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        w = Worker(name, proc, log, fh)
        self.workers.append(w)
        if wait_ready:
            # a wake-up published before the worker declared its queue is dropped by Redis
            # (the next tick's sweep would publish again); tests wait instead of ticking
            wait_for(lambda: "ready." in w.text() or w.proc.poll() is not None, 30, "ready")
            assert w.proc.poll() is None, w.text()
        return w

    def job(self, ns_id: bytes, job_id: bytes) -> Job:
        with self.engine.connect() as conn:
            return job_store.require_job(conn, ns_id, job_id)

    def jobs(self, ns_id: bytes) -> list[Job]:
        with self.engine.connect() as conn:
            return job_store.list_jobs(conn, ns_id, limit=1000)[0]


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    fh: Any

    def signal(self, sig: int) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        else:
            self.signal(signal.SIGKILL)  # pool children of a dead main process
        self.fh.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def archive_env(
    url: str, engine: Engine, tmp: Path, *, broker: str = REDIS_URL, **overrides: str
) -> Iterator[ArchiveEnv]:
    # a RabbitMQ broker is a virtual host of the test's own (tests/support/rabbitmq.py)
    r = redis.Redis.from_url(broker) if broker.startswith("redis") else None
    if r is not None:
        r.flushdb()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(
        ORBIT_DATABASE_URL=url,
        ORBIT_SENDER_DATABASE_URL=f"sqlite:///{tmp / 'business.sqlite3'}",
        CELERY_BROKER_URL=broker,
        ORBIT_ARCHIVE_LEASE_SECONDS=str(LEASE),
        ORBIT_ARCHIVE_SLICE_SECONDS=str(SLICE),
        ORBIT_VAR_DIR=str(tmp / "var"),
        ORBIT_ACTOR="test-operator",
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    settings = load_settings(env)
    app = Celery("orbit-test", broker=broker)
    if is_amqp(broker):  # declared as the fleet declares them (celeryconfig.py)
        # Imported here: the deployment's app and celeryconfig, only for a RabbitMQ test.
        from orbit_tasks.celery_app import QuorumAMQP

        app = Celery("orbit-test", broker=broker, amqp=QuorumAMQP)
        app.conf.task_default_queue_type = app.conf.task_create_missing_queue_type = "quorum"
    app.conf.task_create_missing_queues = True
    ae = ArchiveEnv(url, engine, tmp, env, settings, app)
    try:
        yield ae
    finally:
        for w in ae.workers:
            w.stop()
        app.close()
        if r is not None:
            r.flushdb()
            r.close()


# --- platform setup ----------------------------------------------------------------------------


def make_namespace(engine: Engine, name: str) -> tuple[bytes, bytes]:
    with engine.begin() as conn:
        ns_id = store.create_namespace(conn, name)
        queue_id = store.create_queue(conn, ns_id, "default")
    return ns_id, queue_id


def make_volume(engine: Engine, path: Path, label: str = "") -> bytes:
    storage_id = new_id()
    write_identity(path, storage_id, label)
    with engine.begin() as conn:
        store.register_storage(conn, storage_id, label)
    return storage_id


def make_plan(
    engine: Engine,
    ns_id: bytes,
    kind: str,
    storage_id: bytes,
    *,
    batch_size: int = 5,
    max_bytes: int = 64 * MiB,
    archive_after: int = 3600,
) -> int:
    with engine.begin() as conn:
        rev = store.add_policy_revision(conn, ns_id, kind, archive_after, "test")
        plan_store.set_plan(
            conn,
            ns_id,
            kind,
            storage_id=storage_id,
            interval=86400,
            batch_size=batch_size,
            max_bytes=max_bytes,
            policy_revision=rev,
            enabled=True,
            expect_revision=None,
            now=db_now(conn),
            actor="test",
        )
    return rev


def seed(
    engine: Engine, ns_id: bytes, queue_id: bytes, kind: str, roots: int, seed: int = 1
) -> None:
    spec = generator.make_spec(kind, roots, days=2)
    with engine.begin() as conn:
        generator.seed_history(conn, spec, ns_id, [queue_id], random.Random(seed), db_now(conn))


def make_due(engine: Engine, ns_id: bytes, kind: str) -> None:
    """Test shortcut for "an interval later": the plan is due now."""
    with engine.begin() as conn:
        conn.execute(
            update(archive_plans)
            .where(archive_plans.c.namespace_id == ns_id, archive_plans.c.kind == kind)
            .values(next_run_at=db_now(conn))
        )


def create_job(ae: ArchiveEnv, ns_id: bytes, kind: str) -> Job:
    """Run one tick (which publishes its wake-up) and return the job it created for (ns, kind)."""
    report = ae.tick()
    for ns_hex, k, job_hex in report.jobs_created:
        if ns_hex == ns_id.hex() and k == kind:
            return ae.job(ns_id, bytes.fromhex(job_hex))
    raise AssertionError(f"tick created no job for {kind}: {report.to_dict()}")


def wait_for(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def tick_wait(ae: ArchiveEnv, pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """``wait_for`` that runs a tick every 2 s like beat would (sweeps publish wake-ups)."""
    last = [time.monotonic()]

    def check() -> Any:
        value = pred()
        if not value and time.monotonic() - last[0] > 2:
            ae.tick()
            last[0] = time.monotonic()
        return value

    return wait_for(check, timeout, what, 0.2)


def wait_state(
    ae: ArchiveEnv, job: Job, states: set[JobState], timeout: float = 60, wake: bool = True
) -> Job:
    """Wait for the job to reach one of ``states``; ticks every few seconds like beat would."""
    last_tick = [time.monotonic()]

    def check() -> Job | None:
        j = ae.job(job.namespace_id, job.id)
        if j.state in states:
            return j
        if wake and time.monotonic() - last_tick[0] > 2:
            ae.tick()
            last_tick[0] = time.monotonic()
        return None

    return wait_for(check, timeout, f"job {job.id.hex()} in {sorted(states)}", 0.2)


def wait_marker(marker: Path, timeout: float = 30) -> int:
    wait_for(marker.exists, timeout, f"failpoint marker {marker.name}")
    time.sleep(0.05)
    return int(marker.read_text() or 0)


# --- invariants ---------------------------------------------------------------------------------


def expectation(ae: ArchiveEnv, job: Job) -> Any:
    from orbit_tasks.archive.claims import with_range
    from orbit_tasks.archive.format.expectation import ChainExpectation

    with ae.engine.connect() as conn:
        rng = job_store.job_range(conn, job)
        row = conn.execute(
            select(archive_jobs).where(
                archive_jobs.c.namespace_id == job.namespace_id, archive_jobs.c.id == job.id
            )
        ).one()
    return with_range(ChainExpectation.from_job_row(dict(row._mapping)), rng)


def file_snapshot(volume: Path, job: Job) -> dict[str, bytes]:
    d = job_dir(volume, job.namespace_id, job.id)
    if not d.exists():
        return {}
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if not p.name.startswith(".tmp-")}


def assert_succeeded_exactly(ae: ArchiveEnv, job: Job, volume: Path | Storage) -> list[bytes]:
    """SUCCEEDED, the chain verifies, and the export holds exactly the range's roots once, in
    (settled, id) order; the job directory (a folder or an S3 prefix) holds exactly the chain.
    Returns the exported root ids."""
    job = ae.job(job.namespace_id, job.id)
    assert job.state is JobState.SUCCEEDED, job
    assert job.lease_id is None and job.lease_until is None
    d = open_storage(volume).job(job.namespace_id, job.id)
    report = verify_job_dir(d, expectation(ae, job))
    assert report.ok, (report.first_bad_file, report.reason)
    exported = [bytes.fromhex(obj["root"]["id"]) for obj in export_roots(d, expectation(ae, job))]
    with ae.engine.connect() as conn:
        rng = job_store.job_range(conn, job)
        expected = source.root_keys_in_range(conn, job.kind, job.namespace_id, rng)
    assert exported == expected
    assert job.roots == len(expected)
    names = d.names()
    assert len(names) == job.batches + 1, names  # exactly the chain files
    with ae.engine.connect() as conn:
        plan = conn.execute(
            select(archive_plans.c.active_job_id).where(
                archive_plans.c.namespace_id == job.namespace_id, archive_plans.c.kind == job.kind
            )
        ).scalar()
    assert plan != job.id
    return exported


def cli_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


class _Interleaved:
    """A job directory whose stale-writer removal runs a test's steps around the real removal:
    what other claims do while the stale writer is between two requests (paused, or slow)."""

    def __init__(self, inner: Any, before: Callable[[], None], after: Callable[[], None]) -> None:
        self.inner, self.before, self.after = inner, before, after
        self.removed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def remove_if_unconfirmed(self, name: str, confirmed: Any, stored: Any) -> bool:
        self.before()
        removed = bool(self.inner.remove_if_unconfirmed(name, confirmed, stored))
        self.removed += removed
        self.after()
        return removed


def adoption_race(ae: ArchiveEnv, job: Job, storage: Storage, place: Any) -> tuple[str, int]:
    """SPEC §5 step 6 against a claim taking the job right after the stale writer read the row.

    A stale claim's lease ended; the owner took over (listing: nothing there yet) and released
    the job to PENDING without confirming anything. The stale writer's late write of the
    manifest lands, its confirm is rejected, and it reads the row (PENDING, the manifest ahead
    of it). Then, before its removal: a new claim from PENDING finds the manifest under its own
    name (identical bytes: not created) -- and after the removal, while the stale writer is
    paused before anything else, that claim confirms it and the job runs on to its end.
    Returns the last delivery's outcome and how many removals the stale writer made."""
    from datetime import timedelta

    from orbit_tasks.archive.engine import leftovers, runner
    from orbit_tasks.archive.engine.budget import manifest_file
    from orbit_tasks.archive.format.names import manifest_name
    from orbit_tasks.archive.format.values import sha256_hex
    from orbit_tasks.db.engine import FixedClock
    from orbit_tasks.errors import LeaseLost

    ns = job.namespace_id
    with ae.engine.connect() as conn:
        past = db_now(conn) - timedelta(hours=1)
    stale = job_store.claim(ae.engine, ns, job.id, lease_seconds=60, clock=FixedClock(past))
    assert stale is not None
    owner = job_store.claim(ae.engine, ns, job.id, lease_seconds=60)  # takeover
    assert owner is not None and owner.takeover
    job_store.release(ae.engine, owner)  # PENDING, nothing confirmed
    with ae.engine.connect() as conn:
        with conn.begin():
            rng = job_store.job_range(conn, stale.job)
        data, _ = manifest_file(conn, stale.job, rng)
    name, sha = manifest_name(sha256_hex(data)), sha256_hex(data)
    jf = storage.job(ns, job.id)
    mine = jf.store(name, data)  # the stale writer's late write
    assert mine.created
    try:
        job_store.confirm(
            ae.engine, stale, is_batch=False, roots=0, size=len(data), sha256=sha,
            after="keep", lease_seconds=60,
        )  # fmt: skip
        raise AssertionError("the stale confirm was accepted")
    except LeaseLost:
        pass
    nxt: list[job_store.Claim] = []
    outcome: list[str] = []

    def adopt() -> None:
        if nxt:
            return
        c = job_store.claim(ae.engine, ns, job.id, lease_seconds=60)
        assert c is not None and not c.takeover
        assert not jf.store(name, data).created  # found under its name, identical bytes
        nxt.append(c)

    def confirm_and_run() -> None:
        if outcome:
            return
        job_store.confirm(
            ae.engine, nxt[0], is_batch=False, roots=0, size=len(data), sha256=sha,
            after="release", lease_seconds=60,
        )  # fmt: skip
        out = None
        while out in (None, "released"):
            out = runner.run_job(
                ns.hex(), job.id.hex(), {job.storage_id.hex(): place}, ae.settings,
                engine=ae.engine, publish=lambda *a, **k: None,
            )  # fmt: skip
        outcome.append(str(out))

    paused = _Interleaved(jf, adopt, confirm_and_run)
    with ae.engine.connect() as conn:
        leftovers.remove_unless_confirmed(conn, stale, paused, name, mine)
    adopt()  # the stale writer left it alone: the same claims, after it
    confirm_and_run()
    return outcome[0], paused.removed
