"""Pure: what the sources read, turned into Prometheus metric families (SPEC §12).

No I/O here: the store and the broker probe produce the readings below (with the database clock
in ``now``), this module decides names, labels, zeros and the derived metrics. A reading that is
None means its source could not be read this time: ``orbit_up{source}`` is 0 and the metrics that
need it are left out (never guessed), while the other sources' metrics still come.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from orbit_tasks.archive.controls import WaitReason
from orbit_tasks.archive.jobs import ErrorCode, JobState
from orbit_tasks.queues import CONTROL_QUEUE, SENDER_QUEUE, queue_name
from orbit_tasks.sender import policy
from orbit_tasks.sender.policy import OutboxState

SOURCES = ("platform_db", "business_db", "broker")
JOB_STATES = tuple(s.value for s in JobState)
OUTBOX_STATES = policy.STATES
ACTIVE_OUTBOX_STATES = (OutboxState.PENDING.value, OutboxState.SENDING.value)
# SPEC §12: "PENDING or SENDING rows whose send deadline is less than 1 h away".
NEAR_DEADLINE = dt.timedelta(hours=1)

# SPEC §12 table: the contract. Extra metrics (welcome there) are listed after it.
CONTRACT_METRICS = (
    "orbit_up",
    "orbit_archive_jobs",
    "orbit_archive_jobs_failed",
    "orbit_archive_leases_expired",
    "orbit_archive_oldest_pending_seconds",
    "orbit_archive_plans_overdue",
    "orbit_queue_messages",
    "orbit_queue_consumers",
    "orbit_archive_storage_unserved",
    "orbit_outbox_rows",
    "orbit_outbox_review_rows",
    "orbit_outbox_oldest_pending_seconds",
    "orbit_outbox_rows_near_deadline",
)
EXTRA_METRICS = (
    "orbit_outbox_queue_held_seconds",
    "orbit_source_read_seconds",
    "orbit_archive_confirmed_bytes",
    "orbit_archive_confirmed_roots",
    "orbit_archive_confirmed_files",
    "orbit_archive_claims",
    "orbit_archive_jobs_waiting",
    "orbit_archive_plan_backlog_roots",
    "orbit_archive_plan_backlog_seconds",
    "orbit_archive_plan_interval_seconds",
    "orbit_beat_leader",
    "orbit_beat_last_tick_age_seconds",
    "orbit_archive_storage_info",
)
METRIC_NAMES = CONTRACT_METRICS + EXTRA_METRICS


@dataclass(frozen=True)
class PlanBacklog:
    """One enabled plan's backlog (issue 25 item 4): roots settled and not yet archived."""

    namespace: str  # the namespace's name
    kind: str
    roots: float  # exact up to the probe's cap, extrapolated beyond it (backlog_roots)
    behind_seconds: float  # the range's until - the oldest such root's settled time; 0 if none
    interval_seconds: int


def backlog_roots(
    counted: int, cap: int, first: dt.datetime | None, last: dt.datetime | None,
    until: dt.datetime,
) -> float:  # fmt: skip
    """The backlog's roots from a bounded probe of its first ``cap + 1`` roots (``counted``,
    settled from ``first`` to ``last``): exact when ``counted <= cap``; else the probe's density
    extrapolated to the range's ``until`` (a lower bound, ``counted``, when the probe spans no
    time: a burst of roots in one microsecond)."""
    if counted <= cap or first is None or last is None or last <= first:
        return float(counted)
    return counted * ((until - first) / (last - first))


@dataclass(frozen=True)
class BeatReading:
    """The beat leader's lease (issue 30 item 3) at the database clock."""

    holder: str  # host:pid of the leader ("" before any beat led)
    epoch: int  # +1 at every change of leader
    leading: bool  # its lease has not expired
    since_tick_seconds: float  # since its last tick (since it took over when it sent none)


@dataclass(frozen=True)
class PlatformReading:
    """Archive state read from the platform database, all at the database clock ``now``."""

    now: dt.datetime
    storages: tuple[bytes, ...]
    jobs: Mapping[tuple[bytes, str, str], int]  # (storage, kind, state) -> jobs
    confirmed_bytes: Mapping[tuple[bytes, str], int]  # (storage, kind) -> bytes on the volume
    failed: Mapping[tuple[bytes, str], int]  # (storage, error_code) -> FAILED jobs
    leases_expired: Mapping[bytes, int]  # storage -> RUNNING jobs with lease_until < now
    pending_since: Mapping[bytes, dt.datetime]  # storage -> oldest updated_at of a PENDING job
    plans_overdue: Mapping[bytes, int]  # storage -> enabled plans due before now - 2 ticks
    # (storage, kind) -> over all jobs: confirmed roots, files (batches + manifest), claims taken
    confirmed_roots: Mapping[tuple[bytes, str], int] = field(default_factory=dict)
    confirmed_files: Mapping[tuple[bytes, str], int] = field(default_factory=dict)
    claims: Mapping[tuple[bytes, str], int] = field(default_factory=dict)
    # (storage, reason) -> PENDING jobs with an open wait (issue 16, docs/archive-controls.md)
    waiting: Mapping[tuple[bytes, str], int] = field(default_factory=dict)
    # every enabled plan's backlog (issue 25 item 4), probed as metrics/sources.py says
    backlogs: tuple[PlanBacklog, ...] = ()
    # the beat leader's lease (issue 30 item 3); None before any beat ran
    beat: BeatReading | None = None
    # issue 27: each storage's label (the ``storage_label`` beside ``storage``), every
    # namespace's name by hex id (the ``namespace`` beside ``namespace_id``), and the retired
    # storages, whose jobs (all finished) are left out of every family
    storage_labels: Mapping[bytes, str] = field(default_factory=dict)
    namespace_names: Mapping[str, str] = field(default_factory=dict)
    retired: frozenset[bytes] = frozenset()


@dataclass(frozen=True)
class BusinessReading:
    """Outbox state read from the business database at its clock ``now``."""

    now: dt.datetime
    rows: Mapping[str, int]  # state -> rows
    review: Mapping[str, int]  # last_code -> unresolved REVIEW rows
    oldest_active_created: dt.datetime | None  # oldest created_at of a PENDING/SENDING row
    near_deadline: int
    # (namespace, queue) -> seconds left of a running Retry-After hold (sender_holds)
    holds: Mapping[tuple[str, str], float] = field(default_factory=dict)


@dataclass(frozen=True)
class BrokerReading:
    """Queue depths, and the consumers per queue (None: this broker cannot tell, see
    docs/metrics.md for the filesystem broker)."""

    messages: Mapping[str, int]
    consumers: Mapping[str, int] | None


@dataclass(frozen=True)
class Snapshot:
    """One read of every source; None = that source could not be read (``orbit_up`` 0)."""

    platform: PlatformReading | None
    business: BusinessReading | None
    broker: BrokerReading | None
    business_configured: bool
    read_seconds: Mapping[str, float] = field(default_factory=dict)
    # namespace hex id -> name, from this read of the platform database or the last one that
    # answered (the outbox's holds name their namespace even while the platform is down)
    namespace_names: Mapping[str, str] = field(default_factory=dict)


def storage_label_value(storage: bytes, labels: Mapping[bytes, str]) -> str:
    """The ``storage_label`` of a storage: its label, or its id when it has none (Prometheus
    drops an empty label, and ``by (storage_label)`` would lump the unlabelled together)."""
    return labels.get(storage) or storage.hex()


def queues_for(storages: Sequence[bytes]) -> list[str]:
    """The queues the exporter reports (SPEC §12): control, sender, one per registered storage."""
    return [CONTROL_QUEUE, SENDER_QUEUE, *(queue_name(s) for s in storages)]


def consumers_of(consumers_by_worker: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Queue -> number of workers consuming it, from each worker's queue list."""
    out: dict[str, int] = {}
    for queues in consumers_by_worker.values():
        for queue in set(queues):
            out[queue] = out.get(queue, 0) + 1
    return out


def unserved(platform: PlatformReading, broker: BrokerReading) -> dict[bytes, int] | None:
    """Storage -> 1 when it has PENDING or lease-expired jobs and no worker consumes its queue.
    None when the broker cannot tell who consumes (no guess either way)."""
    if broker.consumers is None:
        return None
    out = {}
    for storage in platform.storages:
        pending = sum(
            n
            for (s, _kind, st), n in platform.jobs.items()
            if (s, st) == (storage, JobState.PENDING)
        )
        waiting = pending > 0 or platform.leases_expired.get(storage, 0) > 0
        served = broker.consumers.get(queue_name(storage), 0) > 0
        out[storage] = int(waiting and not served)
    return out


def _age(now: dt.datetime, since: dt.datetime | None) -> float:
    """Seconds from ``since`` to ``now`` (0 when there is nothing, never negative)."""
    if since is None:
        return 0.0
    return max(0.0, (now - since).total_seconds())


def build(snapshot: Snapshot) -> list[Metric]:
    """Every metric family of one snapshot, in a stable order."""
    return list(_families(snapshot))


def _families(snap: Snapshot) -> Iterator[Metric]:
    up = GaugeMetricFamily("orbit_up", "1 if the source answered this scrape", labels=["source"])
    readings = {"platform_db": snap.platform, "business_db": snap.business, "broker": snap.broker}
    for source in SOURCES:
        if source == "business_db" and not snap.business_configured:
            continue  # no ORBIT_SENDER_DATABASE_URL: not a source of this exporter
        up.add_metric([source], 1.0 if readings[source] is not None else 0.0)
    yield up
    took = GaugeMetricFamily(
        "orbit_source_read_seconds",
        "Seconds the last read of the source took (up to the time bound when it failed)",
        labels=["source"],
    )
    for source, seconds in sorted(snap.read_seconds.items()):
        took.add_metric([source], round(seconds, 6))
    yield took
    if snap.platform is not None:
        yield from _archive(snap.platform)
    if snap.broker is not None:
        storages = snap.platform.storages if snap.platform is not None else ()
        yield from _queues(snap.broker, storages)
        if snap.platform is not None:
            flags = unserved(snap.platform, snap.broker)
            if flags is not None:
                fam = GaugeMetricFamily(
                    "orbit_archive_storage_unserved",
                    "1 when the storage has PENDING or lease-expired jobs and no worker "
                    "consumes its queue, else 0",
                    labels=STORAGE_LABELS,
                )
                for storage, flag in flags.items():
                    fam.add_metric(_storage(snap.platform, storage), float(flag))
                yield fam
    if snap.business is not None:
        yield from _outbox(snap.business, snap.namespace_names)


#: The labels of a storage in every family keyed by storage (issue 27): the id, and the label.
STORAGE_LABELS = ["storage", "storage_label"]


def _storage(p: PlatformReading, storage: bytes) -> list[str]:
    return [storage.hex(), storage_label_value(storage, p.storage_labels)]


def _archive(p: PlatformReading) -> Iterator[Metric]:
    yield _storage_info(p)
    jobs = GaugeMetricFamily(
        "orbit_archive_jobs",
        "Archive jobs in each state",
        labels=[*STORAGE_LABELS, "kind", "state"],
    )
    pairs = sorted({(s, k) for s, k, _state in p.jobs if s not in p.retired})
    for storage, kind in pairs:
        for state in JOB_STATES:
            count = p.jobs.get((storage, kind, state), 0)
            jobs.add_metric([*_storage(p, storage), kind, state], float(count))
    yield jobs
    confirmed = GaugeMetricFamily(
        "orbit_archive_confirmed_bytes",
        "Bytes of archive files confirmed in the database (manifest and batches), all jobs",
        labels=[*STORAGE_LABELS, "kind"],
    )
    for storage, kind in pairs:
        size = p.confirmed_bytes.get((storage, kind), 0)
        confirmed.add_metric([*_storage(p, storage), kind], float(size))
    yield confirmed
    for name, help_text, values in (
        ("orbit_archive_confirmed_roots", "Root records in confirmed archive files, all jobs",
         p.confirmed_roots),
        ("orbit_archive_confirmed_files", "Confirmed archive files (manifests and batches), "
         "all jobs", p.confirmed_files),
        ("orbit_archive_claims", "Claims archive jobs took (from PENDING, chained after each "
         "confirmed file, and takeovers), all jobs", p.claims),
    ):  # fmt: skip
        fam = GaugeMetricFamily(name, help_text, labels=[*STORAGE_LABELS, "kind"])
        for storage, kind in pairs:
            fam.add_metric([*_storage(p, storage), kind], float(values.get((storage, kind), 0)))
        yield fam
    failed = GaugeMetricFamily(
        "orbit_archive_jobs_failed",
        "FAILED archive jobs awaiting an operator, by error code",
        labels=[*STORAGE_LABELS, "error_code"],
    )
    codes = [c.value for c in ErrorCode]
    extra_codes = sorted({code for _s, code in p.failed if code not in codes})
    for storage in p.storages:
        for code in codes + extra_codes:
            n = float(p.failed.get((storage, code), 0))
            failed.add_metric([*_storage(p, storage), code], n)
    yield failed
    per_storage = (
        (
            "orbit_archive_leases_expired",
            "RUNNING jobs whose lease has expired (a dead node, not yet taken over)",
            lambda s: float(p.leases_expired.get(s, 0)),
        ),
        (
            "orbit_archive_oldest_pending_seconds",
            "Seconds the oldest PENDING job has been waiting since it became PENDING, 0 if none",
            lambda s: _age(p.now, p.pending_since.get(s)),
        ),
        (
            "orbit_archive_plans_overdue",
            "Enabled plans due for more than two tick periods (beat not running, or a policy "
            "revision awaiting confirmation)",
            lambda s: float(p.plans_overdue.get(s, 0)),
        ),
    )
    for name, doc, value in per_storage:
        fam = GaugeMetricFamily(name, doc, labels=STORAGE_LABELS)
        for storage in p.storages:
            fam.add_metric(_storage(p, storage), value(storage))
        yield fam
    waiting = GaugeMetricFamily(
        "orbit_archive_jobs_waiting",
        "PENDING archive jobs waiting for a control or the load guard, by reason",
        labels=[*STORAGE_LABELS, "reason"],
    )
    for storage in p.storages:
        for reason in WaitReason:
            n = p.waiting.get((storage, reason.value), 0)
            waiting.add_metric([*_storage(p, storage), reason.value], float(n))
    yield waiting
    for name, doc, value in (
        ("orbit_archive_plan_backlog_roots", "Roots settled and not yet archived by a SUCCEEDED "
         "job of the plan (exact up to 100000, extrapolated beyond)", lambda b: b.roots),
        ("orbit_archive_plan_backlog_seconds", "How far the plan's archive is behind: the "
         "policy's until minus the oldest such root's settled time, 0 if none",
         lambda b: b.behind_seconds),
        ("orbit_archive_plan_interval_seconds", "The plan's interval",
         lambda b: float(b.interval_seconds)),
    ):  # fmt: skip
        fam = GaugeMetricFamily(name, doc, labels=["namespace", "kind"])
        for b in p.backlogs:
            fam.add_metric([b.namespace, b.kind], value(b))
        yield fam
    yield from _beat(p.beat)


def _beat(beat: BeatReading | None) -> Iterator[Metric]:
    """The beat leader (issue 30 item 3): who leads (1 while its lease holds, 0 once it expired
    with no standby taking over) and the time since the last tick any leader sent."""
    leader = GaugeMetricFamily(
        "orbit_beat_leader",
        "The beat holding the leader's lease (host:pid): 1 while the lease holds, else 0",
        labels=["holder", "epoch"],
    )
    age = GaugeMetricFamily(
        "orbit_beat_last_tick_age_seconds",
        "Seconds since the beat leader last sent a tick (since it took over if it sent none)",
    )
    if beat is not None:
        leader.add_metric([beat.holder, str(beat.epoch)], 1.0 if beat.leading else 0.0)
        age.add_metric([], beat.since_tick_seconds)
    yield leader
    yield age


def _storage_info(p: PlatformReading) -> Metric:
    """One series per registered, not retired storage: joins its label onto the families that
    carry only the id (the workers' counters: ``* on (storage) group_left (storage_label)``)."""
    info = GaugeMetricFamily(
        "orbit_archive_storage_info",
        "1 for every registered storage that is not retired, with its label",
        labels=STORAGE_LABELS,
    )
    for storage in p.storages:
        info.add_metric(_storage(p, storage), 1.0)
    return info


def _queues(b: BrokerReading, storages: Sequence[bytes]) -> Iterator[Metric]:
    names = queues_for(storages)
    names += sorted(q for q in b.messages if q not in names)
    messages = GaugeMetricFamily(
        "orbit_queue_messages", "Messages waiting in the broker queue", labels=["queue"]
    )
    for queue in names:
        if queue in b.messages:
            messages.add_metric([queue], float(b.messages[queue]))
    yield messages
    if b.consumers is None:
        return
    consumers = GaugeMetricFamily(
        "orbit_queue_consumers", "Workers consuming the queue now", labels=["queue"]
    )
    for queue in names:
        consumers.add_metric([queue], float(b.consumers.get(queue, 0)))
    yield consumers


def _outbox(b: BusinessReading, namespace_names: Mapping[str, str]) -> Iterator[Metric]:
    rows = GaugeMetricFamily("orbit_outbox_rows", "Outbox rows by state", labels=["state"])
    states = list(OUTBOX_STATES) + sorted(s for s in b.rows if s not in OUTBOX_STATES)
    for state in states:
        rows.add_metric([state], float(b.rows.get(state, 0)))
    yield rows
    review = GaugeMetricFamily(
        "orbit_outbox_review_rows",
        "unresolved REVIEW outbox rows by last_code",
        labels=["last_code"],
    )
    codes = sorted(set(policy.REVIEW_CODES) | set(b.review))
    for code in codes:
        review.add_metric([code], float(b.review.get(code, 0)))
    yield review
    yield GaugeMetricFamily(
        "orbit_outbox_oldest_pending_seconds",
        "Age of the oldest PENDING or SENDING outbox row (since it was enqueued), 0 if none",
        value=_age(b.now, b.oldest_active_created),
    )
    yield GaugeMetricFamily(
        "orbit_outbox_rows_near_deadline",
        "PENDING or SENDING rows whose send deadline is less than 1 h away",
        value=float(b.near_deadline),
    )
    held = GaugeMetricFamily(
        "orbit_outbox_queue_held_seconds",
        "Seconds left of a Retry-After hold of an outbox queue (nothing of it is claimed before)",
        labels=["namespace_id", "namespace", "queue_id"],
    )
    for (namespace_id, queue_id), seconds in sorted(b.holds.items()):
        name = namespace_names.get(namespace_id.lower(), "")
        held.add_metric([namespace_id, name, queue_id], seconds)
    yield held
