"""The one test scene of the archive (issue 26 item 5; procrastinate's ``job_factory``, River's
``testfactory``): a namespace with its queue, a volume (a folder with its identity, registered),
a plan of one kind over seeded history -- and a delivery of a job by the real runner, in the
test's thread or in one of its own. :class:`PlanScene` is the smaller scene of the plan and tick
tests: a namespace and a registered storage whose plans the test sets and reads.

Built on the primitives of :mod:`tests.support.archive_jobs` (``make_namespace``,
``make_volume``, ``make_plan``, ``seed``, ``create_job``); a test that needs another shape calls
those directly."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select, update

from orbit_tasks.archive.jobs import Job
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans
from orbit_tasks.ids import new_id
from orbit_tasks.platform import store
from orbit_tasks.settings import Settings
from tests.support.archive_jobs import MiB, make_namespace, make_plan, make_volume, seed


@dataclass(frozen=True, kw_only=True)
class Scene:
    """What :func:`archive_scene` made: ids of the namespace, its queue and the storage, the
    volume's folder and the plan's kind."""

    engine: Engine
    ns: bytes
    queue: bytes
    volume: Path
    storage: bytes
    kind: str

    @property
    def parts(self) -> tuple[bytes, bytes, Path, bytes]:
        """``ns, queue, volume, storage``: to unpack into the names a test uses."""
        return self.ns, self.queue, self.volume, self.storage


def archive_scene(
    engine: Engine,
    *,
    name: str,
    volume: Path,
    kind: str = "tasks",
    roots: int = 30,
    batch_size: int = 5,
    max_bytes: int = 64 * MiB,
    archive_after: int = 3600,
    label: str = "",
    history_seed: int = 1,
) -> Scene:
    """A namespace ``name`` with a queue, the volume at ``volume`` (labelled ``label``), an
    enabled plan of ``kind`` on it and ``roots`` roots of history seeded by the generator
    (``history_seed``: its random seed)."""
    ns, queue = make_namespace(engine, name)
    storage = make_volume(engine, volume, label)
    make_plan(
        engine,
        ns,
        kind,
        storage,
        batch_size=batch_size,
        max_bytes=max_bytes,
        archive_after=archive_after,
    )
    seed(engine, ns, queue, kind, roots, history_seed)
    return Scene(engine=engine, ns=ns, queue=queue, volume=volume, storage=storage, kind=kind)


def no_publish(*_args: Any, **_kwargs: Any) -> None:
    """A ``publish`` that sends no wake-up (the test delivers the job itself)."""


def deliver(
    job: Job,
    places: dict[str, Any],
    settings: Settings,
    *,
    engine: Engine,
    publish: Callable[..., None] | None = no_publish,
    **kwargs: Any,
) -> str:
    """One delivery of ``job`` by the real runner (the same code as the Celery task); returns
    its outcome. ``publish=None`` leaves the runner's own default."""
    from orbit_tasks.archive.engine import runner

    if publish is not None:
        kwargs["publish"] = publish
    return runner.run_job(
        job.namespace_id.hex(), job.id.hex(), places, settings, engine=engine, **kwargs
    )


def run_claim(
    claim: Any,
    place: Any,
    settings: Settings,
    *,
    engine: Engine,
    publish: Callable[..., None] = no_publish,
) -> str:
    """The claim chain of ``claim``, a claim taken elsewhere (a stale claim resuming after its
    worker was paused), run by the real runner from its first step; returns its outcome."""
    from orbit_tasks.archive.engine import runner
    from orbit_tasks.db.engine import DB_CLOCK, single_statements

    with engine.connect() as conn:
        conn = single_statements(conn)
        storage = runner._open(place, settings)
        run = runner._Delivery(
            engine=engine,
            conn=conn,
            source_db=engine,
            volume=storage,
            directory=storage.job(claim.job.namespace_id, claim.job.id),
            settings=settings,
            clock=DB_CLOCK,
            started=time.monotonic(),
        )
        return runner._run_chain(runner._Chain(run=run, claim=claim), publish)


@dataclass
class DeliveryThread:
    """A delivery running in a thread of its own; ``outcome`` holds its outcome once it ended."""

    thread: threading.Thread
    outcome: list[str] = field(default_factory=list)

    def join(self, timeout: float) -> list[str]:
        self.thread.join(timeout)
        return self.outcome


def deliver_in_thread(
    job: Job, places: dict[str, Any], settings: Settings, *, engine: Engine, **kwargs: Any
) -> DeliveryThread:
    """Start :func:`deliver` in a thread and return at once (the test acts while it runs)."""
    outcome: list[str] = []
    thread = threading.Thread(
        target=lambda: outcome.append(deliver(job, places, settings, engine=engine, **kwargs))
    )
    running = DeliveryThread(thread, outcome)
    thread.start()
    return running


DAY = 86400


class PlanScene:
    """One ACTIVE namespace, one registered storage (an id: no folder, nothing is written) and
    policy revision 1 of ``tasks`` (7 days); :meth:`set` calls the plan store as ``orbit plan
    set`` does, by ``actor``."""

    def __init__(
        self, engine: Engine, *, name: str = "acme", label: str = "vol-a", actor: str = "tester"
    ) -> None:
        self.engine = engine
        self.actor = actor
        self.storage = new_id()
        with engine.begin() as conn:
            self.ns = store.create_namespace(conn, name)
            store.register_storage(conn, self.storage, label)
            store.add_policy_revision(conn, self.ns, "tasks", 7 * DAY, "test")

    def set(
        self, kind: str = "tasks", *, now: dt.datetime | None = None, **kw: Any
    ) -> plan_store.SetPlanResult:
        """Set the plan of ``kind`` (daily, 100 roots, 256 MiB, revision 1, enabled unless
        ``kw`` says otherwise) at ``now`` (default: the database's clock)."""
        args: dict[str, Any] = dict(
            storage_id=self.storage,
            interval=DAY,
            batch_size=100,
            max_bytes=256 * MiB,
            policy_revision=1,
            enabled=True,
            expect_revision=None,
        )
        args.update(kw)
        with self.engine.begin() as conn:
            at = db_now(conn) if now is None else now
            return plan_store.set_plan(conn, self.ns, kind, now=at, actor=self.actor, **args)

    def plan(self, kind: str = "tasks") -> plan_store.Plan:
        with self.engine.connect() as conn:
            plan = plan_store.get_plan(conn, self.ns, kind)
        assert plan is not None
        return plan

    def jobs(self) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(archive_jobs).order_by(archive_jobs.c.created_at)))

    def counts(self) -> tuple[int, int, int]:
        """Rows of plans, jobs and audit events (of every namespace)."""
        with self.engine.connect() as conn:
            return (
                conn.execute(select(func.count()).select_from(archive_plans)).scalar_one(),
                conn.execute(select(func.count()).select_from(archive_jobs)).scalar_one(),
                conn.execute(select(func.count()).select_from(audit_events)).scalar_one(),
            )

    def move_next_run(self, delta: dt.timedelta, kind: str = "tasks") -> dt.datetime:
        """Test-only: pretend time passed by moving next_run_at back by ``delta`` from now."""
        with self.engine.begin() as conn:
            value = db_now(conn) - delta
            conn.execute(
                update(archive_plans)
                .where(archive_plans.c.namespace_id == self.ns, archive_plans.c.kind == kind)
                .values(next_run_at=value)
            )
        return value
