"""May this job run now? Asked before every claim and at every batch boundary (issue 16).

The rules are pure (``archive/controls.py``: ``CHECKS``); this module reads what they look at
and acts on the answer. Per claim chain (:func:`open_gate`, before the claim, so a waiting job
is never claimed just to find out): the control generation with the database clock, the controls
in force for the job's scope, whether the job has an open wait, ``Threads_running`` when
``ORBIT_ARCHIVE_MAX_THREADS_RUNNING`` is set, and the throttles' budgets. Per batch
(:meth:`Gate.at_boundary`), only what is in force: with no control and no load guard it returns
at once (no statement, no clock read); windows are judged on the database time estimated from
the claim's clock and the monotonic clock; ``Threads_running`` is read at most once a second; a
throttle charges the file's roots to the shared budget and sleeps its turn when the slice
allows, else the claim stops. Before a claim a throttled job reserves its turn
(:meth:`Gate.reserve`) rather than only looking, so a running claim cannot starve it. Pauses and
changed controls reach a running claim through its chained confirm, which compares the
generation inside the UPDATE (``store.jobs.confirm``): when it changed, the runner reloads the
gate (:meth:`Gate.reload`) and asks again.

The gate also decides and records the waits (issue 26 item 2): the wait before a claim, a short
throttle turn slept there (:meth:`Gate.wait_before_claim`), the wait a claim stopped for at a
batch boundary (:meth:`Gate.record_wait`, :func:`record_wait`) and its end at the next claim
(:meth:`Gate.claimed`). The runner asks; it never reaches the control store itself.

A replica's lag (``replica_lag``) is one more check: add its reading to :meth:`Gate.situation`
and its rule to ``controls.CHECKS``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, select

from orbit_tasks.archive import controls as rules
from orbit_tasks.archive.controls import Control, JobView, Situation, WaitReason
from orbit_tasks.archive.jobs import Job
from orbit_tasks.archive.store import controls as store
from orbit_tasks.db.engine import Clock, atomic
from orbit_tasks.settings import Settings


@dataclass(kw_only=True)
class Gate:
    """The controls of one claim chain, read before its first claim."""

    job: JobView
    settings: Settings
    clock: Clock
    generation: int
    controls: tuple[Control, ...]
    open_wait: bool
    db_now: datetime  # the database clock when read ...
    mono: float  # ... and the monotonic clock at that moment
    last_load: float = field(default=-1e9)
    threads_running: int | None = None
    charged_seq: int = -1  # the file whose roots the throttles were charged for
    prepaid: int = 0  # roots reserved before the claim (:meth:`reserve`), not yet charged
    extra: dict[str, object] = field(default_factory=dict)  # Situation.extra (replica's beat)

    @property
    def max_threads(self) -> int | None:
        return self.settings.archive_max_threads_running

    @property
    def idle(self) -> bool:
        """Nothing to check at a batch boundary: no control in force, no load guard."""
        return not self.controls and self.max_threads is None

    def now(self) -> datetime:
        """The database time, estimated from the clock read and the monotonic clock since."""
        return self.db_now + timedelta(seconds=time.monotonic() - self.mono)

    def _load(self, conn: Connection, *, force: bool) -> None:
        if self.max_threads is None:
            return
        mono = time.monotonic()
        if force or mono - self.last_load >= rules.LOAD_CHECK_SECONDS:
            with conn.begin():
                self.threads_running = store.threads_running(conn)
            self.last_load = mono

    def situation(self, throttle_wait: float = 0.0) -> Situation:
        return Situation(
            now=self.now(),
            controls=self.controls,
            threads_running=self.threads_running,
            max_threads_running=self.max_threads,
            throttle_wait=throttle_wait,
            extra=self.extra,
        )

    def throttle_keys(self) -> list[str]:
        return [c.scope.key for c in rules.throttles(self.controls)]

    def before_claim(self, conn: Connection) -> tuple[WaitReason | None, float]:
        """The first reason this job may not be claimed now, and the throttle's wait."""
        self._load(conn, force=True)
        wait = 0.0
        if self.throttle_keys():
            with conn.begin():
                wait = store.budget_waits(conn, self.throttle_keys(), clock=self.clock)
        return rules.first_wait(self.job, self.situation(wait)), wait

    def reserve(self, conn: Connection, roots: int) -> float:
        """Before the claim, when the throttles' budgets are busy: take this job's turn for its
        first ``roots`` now (the seconds to sleep before claiming). Only looking would starve it
        behind a running claim that takes the next turn the moment the last one is paid for; a
        reservation queues it like any other taker. The roots are charged to the files the
        claim confirms first (:meth:`at_boundary`), never twice."""
        wait = self._take(conn, roots)
        self.prepaid = roots
        return wait

    def at_boundary(
        self, conn: Connection, seq: int, roots: int, deadline: float
    ) -> WaitReason | None:
        """Before the confirm of file ``seq`` (``roots`` roots) that would chain the next claim:
        a reason to release the job instead, or None to go on (after sleeping a throttle's turn
        when the slice allows it)."""
        if self.idle:
            return None
        self._load(conn, force=False)
        reason = rules.first_wait(self.job, self.situation())
        if reason is not None:
            return reason
        wait = 0.0
        if self.charged_seq != seq:
            self.charged_seq = seq
            if self.prepaid:  # paid for by the reservation (up to what it covers): no new turn
                covered = min(self.prepaid, roots)
                self.prepaid -= covered
                roots -= covered
                if roots:
                    wait = self._take(conn, roots)
            else:
                wait = self._take(conn, roots)
        if wait <= 0:
            return None
        if time.monotonic() + wait >= deadline:
            return WaitReason.THROTTLED
        time.sleep(wait)
        return None

    def _take(self, conn: Connection, roots: int) -> float:
        """Charge ``roots`` to every throttle in force; the longest turn to wait."""
        wait = 0.0
        for c in rules.throttles(self.controls):
            assert c.max_roots_per_second is not None
            wait = max(
                wait,
                store.take_budget(
                    conn, c.scope.key, roots, c.max_roots_per_second, clock=self.clock
                ),
            )
        return wait

    def wait_before_claim(self, conn: Connection, roots: int, started: float) -> WaitReason | None:
        """Ask the checks before claiming (a waiting job is never claimed to find out). A short
        throttle wait is reserved (for the first ``roots``) and slept here, holding no claim, when
        it ends within the first half of the slice that began at ``started`` (a fixed cap shorter
        than that would leave the continuation of a ``throttled`` stop, which sees up to two
        batches' cost, waiting for the tick); any other reason is recorded as the job's wait and
        returned."""
        budget = started + self.settings.archive_slice_seconds / 2
        while True:
            reason, wait = self.before_claim(conn)
            if reason is None:
                return None
            short = time.monotonic() + wait < budget
            if reason is not WaitReason.THROTTLED or not short:
                break
            # take this job's turn (its first batch) and sleep it: only looking again would
            # starve behind a running claim that takes the next turn as soon as the last is paid
            time.sleep(self.reserve(conn, roots))
            if not self.changed(conn):
                return None
            # a control changed while it slept (a pause, a window closing): ask again before the
            # claim, or a paused job would be claimed and write a batch; its turn stays reserved
            self.reload(conn)
            reason, _wait = self.before_claim(conn)
            if reason is None or reason is WaitReason.THROTTLED:
                return None
            break
        self.record_wait(conn, reason)
        return reason

    def record_wait(self, conn: Connection, reason: WaitReason) -> None:
        """The job waits for ``reason`` from now on (before its claim, or stopped at a batch
        boundary)."""
        record_wait(conn, self.job.namespace_id, self.job.job_id, reason, self.clock)

    def claimed(self, conn: Connection, claimed_at: datetime) -> None:
        """The job was claimed at ``claimed_at``: the wait it had open (if any) ends then."""
        if self.open_wait:
            with atomic(conn):
                store.close_waits(conn, self.job.namespace_id, self.job.job_id, claimed_at)

    def changed(self, conn: Connection) -> bool:
        """Whether a control changed since the gate read the generation (one statement)."""
        with conn.begin():
            return store.read_generation(conn) != self.generation

    def reload(self, conn: Connection) -> None:
        """The generation changed under a running claim: read the controls again."""
        fresh = open_gate(conn, self.job, self.settings, self.clock, waits=False)
        self.generation, self.controls = fresh.generation, fresh.controls
        self.db_now, self.mono = fresh.db_now, fresh.mono


def record_wait(
    conn: Connection, namespace_id: bytes, job_id: bytes, reason: WaitReason, clock: Clock
) -> None:
    """Job ``job_id`` waits for ``reason`` from the database's now on (one transaction; a wait
    already open for the same reason keeps its start)."""
    with atomic(conn):
        store.record_wait(conn, namespace_id, job_id, reason, clock.now(conn))


def view(job: Job) -> JobView:
    return JobView(job.storage_id, job.namespace_id, job.kind, job.id, job.created_at)


def open_gate(
    conn: Connection, job: JobView, settings: Settings, clock: Clock, *, waits: bool = True
) -> Gate:
    """Read the controls of ``job``'s scope (before its claim): the generation with the clock,
    the controls in force, whether the job has an open wait. Two statements (three with
    ``waits``) in one read-only transaction."""
    with conn.begin():
        row = conn.execute(
            select(store.generation_query().label("g"), clock.sql().label("now"))
        ).one()
        mono = time.monotonic()
        controls = (
            tuple(store.controls_for(conn, job.storage_id, job.namespace_id, job.kind))
            if int(row.g)
            else ()
        )
        open_wait = waits and store.has_open_wait(conn, job.namespace_id, job.job_id)
    return Gate(
        job=job, settings=settings, clock=clock, generation=int(row.g), controls=controls,
        open_wait=open_wait, db_now=row.now, mono=mono,
    )  # fmt: skip
