"""Pure: readings -> metric families (names and labels of SPEC §12, zeros, derived metrics),
checked through the real text exposition and ``prometheus_client.parser``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from orbit_tasks.metrics.families import (
    CONTRACT_METRICS,
    METRIC_NAMES,
    BeatReading,
    BrokerReading,
    BusinessReading,
    PlanBacklog,
    PlatformReading,
    Snapshot,
    backlog_roots,
    build,
    consumers_of,
)
from orbit_tasks.queues import queue_name
from tests.support.metrics import names, parse, series, value

NOW = dt.datetime(2026, 5, 1, 12, 0, 0)
A, B = bytes(range(16)), bytes(range(16, 32))


def _scrape(snapshot: Snapshot) -> dict:  # type: ignore[type-arg]
    class Fixed:
        def collect(self) -> Any:
            return iter(build(snapshot))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())  # type: ignore[arg-type]
    return parse(generate_latest(registry).decode())


def _platform(**changes: Any) -> PlatformReading:
    base: dict[str, Any] = dict(
        now=NOW,
        storages=(A, B),
        jobs={
            (A, "events", "PENDING"): 2,
            (A, "events", "SUCCEEDED"): 5,
            (B, "audit", "FAILED"): 1,
        },
        confirmed_bytes={(A, "events"): 1234},
        failed={(B, "CHAIN_BROKEN"): 1},
        leases_expired={},
        pending_since={A: NOW - dt.timedelta(seconds=90)},
        plans_overdue={B: 2},
        backlogs=(PlanBacklog("acme", "events", 120.0, 3600.0, 86400),),
        beat=BeatReading(holder="beat-a:7", epoch=3, leading=True, since_tick_seconds=1.5),
    )
    base.update(changes)
    return PlatformReading(**base)


def _business() -> BusinessReading:
    return BusinessReading(
        now=NOW,
        rows={"PENDING": 3, "ACCEPTED": 10, "REVIEW": 2},
        review={"REJECTED": 2},
        oldest_active_created=NOW - dt.timedelta(minutes=5),
        near_deadline=1,
        holds={("ab" * 16, "cd" * 16): 42.5},
    )


def _broker(consumers: dict[str, int] | None) -> BrokerReading:
    return BrokerReading(
        messages={"orbit.control": 0, "orbit.sender": 4, queue_name(A): 1, queue_name(B): 0},
        consumers=consumers,
    )


def test_every_contract_metric_with_its_labels() -> None:
    seconds = {"platform_db": 0.01, "business_db": 0.02, "broker": 1.5}
    snapshot = Snapshot(_platform(), _business(), _broker({}), True, read_seconds=seconds)
    m = _scrape(snapshot)
    assert names(m) == set(METRIC_NAMES)
    assert value(m, "orbit_source_read_seconds", source="broker") == 1.5
    labels = {name: {tuple(k for k, _ in lbl) for (n, lbl) in m if n == name} for name in names(m)}
    assert labels["orbit_up"] == {("source",)}
    assert labels["orbit_archive_jobs"] == {("kind", "state", "storage", "storage_label")}
    assert labels["orbit_archive_jobs_failed"] == {("error_code", "storage", "storage_label")}
    for name in (
        "orbit_archive_leases_expired",
        "orbit_archive_oldest_pending_seconds",
        "orbit_archive_plans_overdue",
        "orbit_archive_storage_unserved",
        "orbit_archive_storage_info",
    ):
        assert labels[name] == {("storage", "storage_label")}
    assert labels["orbit_queue_messages"] == labels["orbit_queue_consumers"] == {("queue",)}
    assert labels["orbit_outbox_rows"] == {("state",)}
    assert labels["orbit_outbox_review_rows"] == {("last_code",)}
    assert labels["orbit_outbox_oldest_pending_seconds"] == {()}
    assert labels["orbit_outbox_rows_near_deadline"] == {()}
    assert labels["orbit_outbox_queue_held_seconds"] == {("namespace", "namespace_id", "queue_id")}
    assert set(CONTRACT_METRICS) <= names(m)
    for name in (
        "orbit_archive_plan_backlog_roots",
        "orbit_archive_plan_backlog_seconds",
        "orbit_archive_plan_interval_seconds",
    ):
        assert labels[name] == {("kind", "namespace")}
    assert value(m, "orbit_archive_plan_backlog_roots", namespace="acme", kind="events") == 120
    assert value(m, "orbit_archive_plan_backlog_seconds", namespace="acme", kind="events") == 3600


def test_backlog_roots_is_exact_up_to_the_cap_and_extrapolated_beyond() -> None:
    t0 = dt.datetime(2026, 1, 1)
    day = dt.timedelta(days=1)
    assert backlog_roots(0, 10, None, None, t0) == 0
    assert backlog_roots(10, 10, t0, t0 + day, t0 + 9 * day) == 10  # within the cap: exact
    # 11 roots probed over the first day of a 10-day range: the density over the whole range
    assert backlog_roots(11, 10, t0, t0 + day, t0 + 10 * day) == 110
    # a burst in one microsecond spans no time: the probe is a lower bound
    assert backlog_roots(11, 10, t0, t0, t0 + day) == 11


def test_all_five_states_per_existing_storage_and_kind_and_zeros_per_storage() -> None:
    m = _scrape(Snapshot(_platform(), None, None, business_configured=False))
    jobs = series(m, "orbit_archive_jobs")
    assert len(jobs) == 2 * 5  # (A, events) and (B, audit), five states each
    assert value(m, "orbit_archive_jobs", storage=A.hex(), kind="events", state="PENDING") == 2
    assert value(m, "orbit_archive_jobs", storage=A.hex(), kind="events", state="FAILED") == 0
    assert value(m, "orbit_archive_jobs", storage=B.hex(), kind="audit", state="ABANDONED") == 0
    assert value(m, "orbit_archive_jobs", storage=A.hex(), kind="audit", state="PENDING") is None
    assert len(series(m, "orbit_archive_jobs_failed")) == 2 * 12  # every ErrorCode
    assert value(m, "orbit_archive_jobs_failed", storage=B.hex(), error_code="CHAIN_BROKEN") == 1
    assert value(m, "orbit_archive_jobs_failed", storage=A.hex(), error_code="STALLED") == 0
    assert value(m, "orbit_archive_leases_expired", storage=A.hex()) == 0
    assert value(m, "orbit_archive_oldest_pending_seconds", storage=A.hex()) == 90
    assert value(m, "orbit_archive_oldest_pending_seconds", storage=B.hex()) == 0
    assert value(m, "orbit_archive_plans_overdue", storage=B.hex()) == 2


def test_unserved_needs_waiting_jobs_and_no_consumer() -> None:
    qa, qb = queue_name(A), queue_name(B)
    cases = [
        # (pending on A, expired lease on B, consumers) -> (unserved A, unserved B)
        (2, 0, {}, (1, 0)),
        (2, 0, {qa: 1}, (0, 0)),
        (0, 1, {qa: 1}, (0, 1)),
        (0, 1, {qb: 2}, (0, 0)),
        (0, 0, {}, (0, 0)),
    ]
    for pending, expired, consumers, expect in cases:
        reading = _platform(jobs={(A, "events", "PENDING"): pending}, leases_expired={B: expired})
        m = _scrape(Snapshot(reading, None, _broker(consumers), business_configured=False))
        got = (
            value(m, "orbit_archive_storage_unserved", storage=A.hex()),
            value(m, "orbit_archive_storage_unserved", storage=B.hex()),
        )
        assert got == expect, (pending, expired, consumers)
        assert value(m, "orbit_queue_consumers", queue=qa) == consumers.get(qa, 0)


def test_a_source_down_leaves_out_only_what_needs_it() -> None:
    m = _scrape(Snapshot(_platform(), _business(), None, business_configured=True))
    assert value(m, "orbit_up", source="broker") == 0
    assert value(m, "orbit_up", source="platform_db") == 1
    assert not names(m) & {
        "orbit_queue_messages",
        "orbit_queue_consumers",
        "orbit_archive_storage_unserved",
    }
    assert "orbit_archive_jobs" in names(m) and "orbit_outbox_rows" in names(m)

    m = _scrape(Snapshot(None, _business(), _broker({}), business_configured=True))
    assert value(m, "orbit_up", source="platform_db") == 0
    assert not {n for n in names(m) if n.startswith("orbit_archive_")}
    # the broker still reports the fixed queues without the storage list
    assert value(m, "orbit_queue_messages", queue="orbit.sender") == 4
    assert value(m, "orbit_queue_consumers", queue="orbit.control") == 0

    m = _scrape(Snapshot(_platform(), None, _broker({}), business_configured=True))
    assert value(m, "orbit_up", source="business_db") == 0
    assert not {n for n in names(m) if n.startswith("orbit_outbox_")}

    m = _scrape(Snapshot(_platform(), None, _broker({}), business_configured=False))
    assert value(m, "orbit_up", source="business_db") is None  # not a source of this exporter


def test_filesystem_broker_reports_messages_but_no_consumers() -> None:
    m = _scrape(Snapshot(_platform(), None, _broker(None), business_configured=False))
    assert value(m, "orbit_up", source="broker") == 1
    assert value(m, "orbit_queue_messages", queue=queue_name(A)) == 1
    assert "orbit_queue_consumers" not in names(m)
    assert "orbit_archive_storage_unserved" not in names(m)  # never guessed


def test_outbox_states_and_review_codes_with_zeros_and_ages() -> None:
    m = _scrape(Snapshot(None, _business(), None, business_configured=True))
    rows = {dict(k)["state"]: v for k, v in series(m, "orbit_outbox_rows").items()}
    assert rows == {"PENDING": 3, "SENDING": 0, "ACCEPTED": 10, "REVIEW": 2}
    review = {dict(k)["last_code"]: v for k, v in series(m, "orbit_outbox_review_rows").items()}
    assert review["REJECTED"] == 2 and review["DEADLINE_EXCEEDED"] == 0
    assert len(review) == 10
    assert value(m, "orbit_outbox_oldest_pending_seconds") == 300
    assert value(m, "orbit_outbox_rows_near_deadline") == 1
    held = series(m, "orbit_outbox_queue_held_seconds")
    # the platform was not read: the namespace's name is unknown (Snapshot.namespace_names)
    assert held == {(("namespace", ""), ("namespace_id", "ab" * 16), ("queue_id", "cd" * 16)): 42.5}
    empty = BusinessReading(NOW, {}, {}, None, 0)
    m = _scrape(Snapshot(None, empty, None, business_configured=True))
    assert value(m, "orbit_outbox_oldest_pending_seconds") == 0
    assert series(m, "orbit_outbox_queue_held_seconds") == {}  # no hold: no series
    # a row created after the clock read (clock skew between statements) is not negative
    skewed = BusinessReading(NOW, {"PENDING": 1}, {}, NOW + dt.timedelta(seconds=1), 0)
    m = _scrape(Snapshot(None, skewed, None, business_configured=True))
    assert value(m, "orbit_outbox_oldest_pending_seconds") == 0


def test_consumers_count_workers_not_subscriptions() -> None:
    got = consumers_of({"w1": ["q1", "q1", "q2"], "w2": ["q1"], "w3": []})
    assert got == {"q1": 2, "q2": 1}


def test_archived_roots_files_and_claims_per_storage_and_kind_with_zeros() -> None:
    platform = _platform(
        confirmed_roots={(A, "events"): 500},
        confirmed_files={(A, "events"): 6},
        claims={(A, "events"): 7},
    )
    m = _scrape(Snapshot(platform, None, None, False))
    assert value(m, "orbit_archive_confirmed_roots", storage=A.hex(), kind="events") == 500
    assert value(m, "orbit_archive_confirmed_files", storage=A.hex(), kind="events") == 6
    assert value(m, "orbit_archive_claims", storage=A.hex(), kind="events") == 7
    for name in ("orbit_archive_confirmed_roots", "orbit_archive_confirmed_files",
                 "orbit_archive_claims"):  # fmt: skip
        assert value(m, name, storage=B.hex(), kind="audit") == 0  # a pair with jobs: zero


def test_storages_carry_their_label_and_retired_ones_drop_out() -> None:
    """Issue 27: every family keyed by storage carries ``storage_label`` beside the id (the id
    when the label is empty); the finished jobs of a retired storage are in no family; the
    outbox's holds name their namespace."""
    retired = bytes(range(32, 48))
    jobs = {(A, "events", "SUCCEEDED"): 5, (retired, "tasks", "SUCCEEDED"): 9}
    platform = _platform(
        storages=(A, B),
        jobs=jobs,
        confirmed_bytes={(A, "events"): 10, (retired, "tasks"): 99},
        storage_labels={A: "disk-1 🚀", B: ""},
        retired=frozenset({retired}),
    )
    names_ = {"ab" * 16: "acme"}
    m = _scrape(Snapshot(platform, _business(), _broker({}), True, namespace_names=names_))
    assert value(m, "orbit_archive_storage_info", storage=A.hex(), storage_label="disk-1 🚀") == 1
    assert value(m, "orbit_archive_storage_info", storage=B.hex(), storage_label=B.hex()) == 1
    assert len(series(m, "orbit_archive_storage_info")) == 2
    full = {"storage": A.hex(), "storage_label": "disk-1 🚀"}
    assert value(m, "orbit_archive_jobs", **full, kind="events", state="SUCCEEDED") == 5
    assert value(m, "orbit_archive_confirmed_bytes", **full, kind="events") == 10
    for name in ("orbit_archive_jobs", "orbit_archive_confirmed_bytes", "orbit_archive_claims"):
        assert all(dict(k)["storage"] != retired.hex() for k in series(m, name)), name
    assert all(
        dict(k)["storage"] in (A.hex(), B.hex())
        for (n, k) in m
        if n.startswith("orbit_archive_") and "storage" in dict(k)
    )
    held = series(m, "orbit_outbox_queue_held_seconds")
    assert held == {
        (("namespace", "acme"), ("namespace_id", "ab" * 16), ("queue_id", "cd" * 16)): 42.5
    }
