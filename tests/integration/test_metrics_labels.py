"""Readable metrics (issue 27): the real exporter (``orbit metrics serve``) scraped over HTTP.

Every family keyed by storage carries ``storage_label`` beside the ``storage`` id (the id when
the storage has no label), ``orbit_archive_storage_info`` names each live storage, the outbox's
holds carry the ``namespace`` name beside ``namespace_id``, and a retired storage -- whose
finished job was counted a scrape before -- drops out of every family and of the broker probe.
Real MariaDB, our Redis, a migrated business database, the real runner and ``orbit`` script.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.engine import db_now
from orbit_tasks.queues import queue_name
from orbit_tasks.sender import holds
from tests.support.archive_jobs import (
    ArchiveEnv,
    create_job,
    make_namespace,
    make_plan,
    make_volume,
    seed,
)
from tests.support.db import migrated_engine
from tests.support.metrics import Samples, running_exporter, series, value
from tests.support.scene import deliver

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]


def _storages_in(samples: Samples) -> set[str]:
    """Every storage id any ``orbit_archive_*`` series names, and the archive queues probed."""
    found = {dict(lbl)["storage"] for (n, lbl) in samples if "storage" in dict(lbl)}
    queues = {dict(lbl)["queue"] for (n, lbl) in samples if n == "orbit_queue_messages"}
    return found | {q for q in queues if q.startswith("orbit.archive.")}


def test_storage_labels_namespace_names_and_a_retired_storage_dropping_out(
    ae: ArchiveEnv, tmp_path: Path
) -> None:
    engine: Engine = ae.engine
    ns, q = make_namespace(engine, "acme")
    sid_a = make_volume(engine, tmp_path / "vol-a", "disk-1 🚀")
    sid_b = make_volume(engine, tmp_path / "vol-b", "")
    sid_old = make_volume(engine, tmp_path / "vol-old", "old")
    a, b, old = sid_a.hex(), sid_b.hex(), sid_old.hex()
    make_plan(engine, ns, "events", sid_old)
    make_plan(engine, ns, "audit", sid_a)
    seed(engine, ns, q, "events", 12)
    seed(engine, ns, q, "audit", 5)
    archived = create_job(ae, ns, "events")  # the tick also creates the audit job on a
    outcome = None
    while outcome in (None, "released"):
        places = {old: tmp_path / "vol-old"}
        outcome = deliver(archived, places, ae.settings, engine=engine)
    assert ae.job(ns, archived.id).state == JobState.SUCCEEDED

    business_url = f"sqlite:///{tmp_path / 'business-holds.sqlite3'}"
    queue_hex = "cd" * 16
    with migrated_engine(business_url, "business") as business:
        with business.begin() as conn:
            now = db_now(conn)
            holds.write_hold(
                conn, ns.hex(), queue_hex, until=now.replace(year=now.year + 1), status=429,
                asked_seconds=60, now=now,
            )  # fmt: skip
        env = dict(ae.env, ORBIT_SENDER_DATABASE_URL=business_url, ORBIT_METRICS_CACHE_SECONDS="0")
        with running_exporter(env, tmp_path) as exporter:
            before = exporter.scrape()
            info = series(before, "orbit_archive_storage_info")
            assert {dict(k)["storage"]: dict(k)["storage_label"] for k in info} == {
                a: "disk-1 🚀",
                b: b,  # no label: the id, never an empty (dropped) label
                old: "old",
            }
            full_a = {"storage": a, "storage_label": "disk-1 🚀"}
            pending = value(before, "orbit_archive_jobs", **full_a, kind="audit", state="PENDING")
            assert pending == 1
            assert value(before, "orbit_archive_plans_overdue", **full_a) == 0
            assert value(before, "orbit_archive_storage_unserved", **full_a) == 1
            for name in ("orbit_archive_jobs_failed", "orbit_archive_jobs_waiting"):
                assert all("storage_label" in dict(k) for k in series(before, name)), name
            done = value(
                before, "orbit_archive_jobs", storage=old, storage_label="old", kind="events",
                state="SUCCEEDED",
            )  # fmt: skip
            assert done == 1
            assert value(before, "orbit_archive_confirmed_bytes", storage=old, kind="events")
            assert old in _storages_in(before) and queue_name(sid_old) in _storages_in(before)
            held = series(before, "orbit_outbox_queue_held_seconds")
            assert [dict(k) for k in held] == [
                {"namespace_id": ns.hex(), "namespace": "acme", "queue_id": queue_hex}
            ]

            ae.orbit("plan", "set", "acme", "events", "--disable")
            ae.orbit("storage", "retire", "old", "--reason", "decommissioned")
            after = exporter.scrape()
            assert old not in _storages_in(after)
            assert queue_name(sid_old) not in _storages_in(after)
            assert {dict(k)["storage"] for k in series(after, "orbit_archive_storage_info")} == {
                a,
                b,
            }
            assert value(after, "orbit_archive_jobs", **full_a, kind="audit", state="PENDING") == 1
