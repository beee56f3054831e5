"""Seeing the catch-up (issue 25 item 4): the backlog in ``orbit plan preview`` / ``plan show``
and the exporter's backlog gauges. Real MariaDB, the real CLI; counts compared with SQL
written in tests/integration/test_plan_preview.py."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, insert

from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.platform_tables import archive_jobs, archive_policies
from orbit_tasks.ids import new_id
from orbit_tasks.metrics import store
from orbit_tasks.metrics.sources import PlatformSource
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.integration.test_plan_preview import sql_counts
from tests.support.archive_jobs import make_namespace
from tests.support.cli import invoke_json, invoke_orbit, orbit_env
from tests.support.metrics import free_port
from tests.support.scene import archive_scene

pytestmark = pytest.mark.mariadb

ARCHIVE_AFTER = 3600


def _setup(engine: Engine, tmp_path: Path, name: str, roots: int) -> tuple[bytes, bytes]:
    scene = archive_scene(
        engine, name=name, volume=tmp_path / f"vol-{name}", label=name, roots=roots,
        batch_size=7, max_bytes=1024**2, archive_after=ARCHIVE_AFTER,
    )  # fmt: skip
    return scene.ns, scene.storage


def _old_success(engine: Engine, ns: bytes, sid: bytes, roots: int, seconds: int) -> None:
    """A SUCCEEDED job created 5 days ago (its range ends before every seeded root) that took
    ``seconds`` for ``roots`` roots: the plan's measured rate."""
    with engine.begin() as conn:
        created = db_now(conn) - dt.timedelta(days=5)
        conn.execute(
            insert(archive_jobs).values(
                namespace_id=ns, id=new_id(), kind="tasks", plan_revision=1, policy_revision=1,
                storage_id=sid, batch_size=7, max_bytes=1024**2, state="SUCCEEDED", roots=roots,
                batches=1, bytes=100, created_at=created,
                updated_at=created + dt.timedelta(seconds=seconds),
            )
        )  # fmt: skip


def test_preview_and_show_give_the_backlog_jobs_and_time_at_the_measured_rate(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    ns, sid = _setup(platform_engine, tmp_path, "backlog", 300)
    env = orbit_env(mariadb_url)
    doc = invoke_json(["plan", "preview", "backlog", "tasks"], env)
    start = None if doc["range_from"] is None else dt.datetime.fromisoformat(doc["range_from"][:-1])
    until = dt.datetime.fromisoformat(doc["range_until"][:-1])
    roots, _ = sql_counts(platform_engine, "tasks", ns, start, until)
    assert roots > 0 and doc["backlog_roots"] == roots
    assert doc["backlog_bytes"] == doc["estimated_bytes"]
    assert doc["backlog_jobs"] == max(1, math.ceil(doc["estimated_bytes"] / (1024**2)))
    # no SUCCEEDED job yet: no rate, the time is unknown
    assert doc["rate_roots_per_second"] is None and doc["backlog_eta_seconds"] is None
    text = invoke_orbit(["plan", "show", "backlog", "tasks"], env)
    assert text.exit_code == 0, text.stderr
    assert f"backlog         {roots} roots," in text.stdout
    assert "time unknown" in text.stdout
    _old_success(platform_engine, ns, sid, roots=500, seconds=10)  # 50 roots/s
    shown = invoke_json(["plan", "show", "backlog", "tasks"], env)
    assert shown["backlog_roots"] == roots  # its range ends before every seeded root
    assert shown["rate_roots_per_second"] == 50.0
    assert shown["backlog_eta_seconds"] == pytest.approx(roots / 50, abs=0.1)
    text = invoke_orbit(["plan", "preview", "backlog", "tasks"], env)
    assert "at 50.0 roots/s" in text.stdout, text.stdout


def test_the_exporter_gauge_counts_the_backlog_exactly_up_to_its_cap_then_extrapolates(
    platform_engine: Engine, tmp_path: Path
) -> None:
    ns, _ = _setup(platform_engine, tmp_path, "gauge", 200)
    source = PlatformSource(platform_engine, tick_seconds=60)
    reading = source.read()
    (b,) = [b for b in reading.backlogs if b.namespace == "gauge"]
    until = reading.now - dt.timedelta(seconds=ARCHIVE_AFTER)
    exact, _ = sql_counts(platform_engine, "tasks", ns, None, until)
    assert b.kind == "tasks" and b.roots == exact > 0 and b.interval_seconds == 86400
    assert 0 < b.behind_seconds < 3 * 86400  # the generator settles roots within two days
    # beyond the cap: a bounded probe, extrapolated (the generator spreads roots evenly)
    capped = PlatformSource(platform_engine, tick_seconds=60)
    capped.backlog_cap = exact // 4
    (c,) = [c for c in capped.read().backlogs if c.namespace == "gauge"]
    assert c.roots != exact and exact / 3 < c.roots < exact * 3
    # read again within BACKLOG_SECONDS: the cached value, no probe
    seed_more = source.read()
    assert [x for x in seed_more.backlogs if x.namespace == "gauge"] == [b]


def test_the_backlog_probe_reads_the_settled_index_of_every_kind(
    platform_engine: Engine, tmp_path: Path
) -> None:
    ns, _ = make_namespace(platform_engine, "probe")
    until = dt.datetime(2030, 1, 1)
    with platform_engine.connect() as conn:
        for kind, hk in HISTORY_KINDS.items():
            query = store.backlog_probe_query(kind, ns, ArchiveRange(None, until), 100_000)
            compiled = query.compile(
                dialect=conn.dialect, compile_kwargs={"render_postcompile": True}
            )
            params = compiled.construct_params()
            args = tuple(params[k] for k in compiled.positiontup or ())
            rows = conn.exec_driver_sql("EXPLAIN " + compiled.string, args).mappings().all()
            root = [r for r in rows if r["table"] == hk.root.name]
            assert len(root) == 1, rows
            index = next(i.name for i in hk.root.indexes if i.name and i.name.endswith("settled"))
            assert root[0]["key"] == index, (kind, rows)
            assert "filesort" not in (root[0]["Extra"] or ""), (kind, rows)


def test_job_show_says_when_a_range_was_cut_short_and_nothing_otherwise() -> None:
    """The seam for budget-sized ranges: ``range.cut`` present -> one clause on the range line."""
    from orbit_tasks.cli.job import _range_text

    rng = {"from": None, "until": "2026-01-02T00:00:00.000000Z"}
    assert _range_text(rng) == "(start) .. 2026-01-02T00:00:00.000000Z"
    cut = {**rng, "cut": {"until": "2026-01-01T00:00:00.000000Z", "reason": "max_bytes"}}
    assert _range_text(cut).endswith("(cut short at 2026-01-01T00:00:00.000000Z: max_bytes)")
    assert _range_text(None) == "-"


def test_without_its_policy_row_the_backlog_is_unknown_not_zero(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    ns, _ = _setup(platform_engine, tmp_path, "nopolicy", 20)
    with platform_engine.begin() as conn:
        conn.execute(delete(archive_policies).where(archive_policies.c.namespace_id == ns))
    env = orbit_env(mariadb_url)
    doc = invoke_json(["plan", "show", "nopolicy", "tasks"], env)
    assert doc["backlog_roots"] is None and doc["backlog_jobs"] is None
    assert doc["backlog_eta_seconds"] is None
    text = invoke_orbit(["plan", "preview", "nopolicy", "tasks"], env)
    assert text.exit_code == 0, text.stderr
    assert "backlog         -  (no range" in text.stdout


def test_plan_show_with_its_source_down_shows_the_plan_and_an_unknown_backlog(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    _setup(platform_engine, tmp_path, "srcdown", 5)
    port = free_port(range(20000, 20100))  # nothing listens there: connection refused
    env = orbit_env(
        mariadb_url, ORBIT_ARCHIVE_SOURCE_URL=f"mysql+mysqldb://root@127.0.0.1:{port}/x"
    )
    doc = invoke_json(["plan", "show", "srcdown", "tasks"], env)
    assert doc["kind"] == "tasks" and doc["backlog_roots"] is None
    assert doc["backlog_unavailable"] == "source unreachable (OperationalError)"
    text = invoke_orbit(["plan", "show", "srcdown", "tasks"], env)
    assert text.exit_code == 0 and "backlog         -  (source unreachable" in text.stdout


def test_a_refresh_spends_its_budget_and_the_next_ones_probe_the_rest_oldest_first(
    platform_engine: Engine, tmp_path: Path
) -> None:
    for name in ("one", "two", "three"):
        _setup(platform_engine, tmp_path, name, 3)
    clock = [0.0]
    source = PlatformSource(platform_engine, tick_seconds=60, clock=lambda: clock[0])
    source.backlog_budget = 0.0  # one probe per refresh

    def seen() -> list[str]:
        return sorted(b.namespace for b in source.read().backlogs)

    assert len(seen()) == 1
    clock[0] = 1.0
    assert len(seen()) == 2
    clock[0] = 2.0
    assert seen() == ["one", "three", "two"]
    assert seen() == ["one", "three", "two"]  # all fresh: nothing probed
    probed = dict(source._probed)
    assert sorted(t for t, _ in probed.values()) == [0.0, 1.0, 2.0]
    clock[0] = 62.5  # every value is old now: the oldest is probed again, one per refresh
    seen()
    again = [k for k in probed if source._probed[k][0] == 62.5]
    assert len(again) == 1 and probed[again[0]][0] == 0.0
