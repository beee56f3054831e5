"""``orbit plan preview NS KIND`` (issue 16 item 6): real MariaDB, the real CLI.

The counts are compared with SQL written here (not the store's queries), the range with the SPEC
§5 rule and with the job a tick then creates, and "writes nothing" with a checksum of every
table of the database before and after.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.archive_jobs import (
    archive_env,
    create_job,
    make_due,
    make_namespace,
    make_plan,
    make_volume,
    seed,
)
from tests.support.cli import (
    assert_one_line_error,
    invoke_json,
    invoke_orbit,
    orbit_env,
    run_orbit,
)
from tests.support.scene import archive_scene

pytestmark = pytest.mark.mariadb

ARCHIVE_AFTER = 3600


def _ts(value: str | None) -> datetime | None:
    return None if value is None else datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")


def table_checksums(engine: Engine) -> dict[str, Any]:
    """``CHECKSUM TABLE`` and the row count of every table of the test's database."""
    with engine.connect() as conn:
        names = conn.execute(
            text(
                "SELECT TABLE_NAME FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME"
            )
        ).scalars()
        out: dict[str, Any] = {}
        for name in names:
            checksum = conn.execute(text(f"CHECKSUM TABLE `{name}` EXTENDED")).one()[1]
            count = conn.execute(text(f"SELECT COUNT(*) FROM `{name}`")).scalar_one()
            out[name] = (checksum, count)
        return out


def sql_counts(
    engine: Engine, kind: str, ns: bytes, start: datetime | None, until: datetime
) -> tuple[int, dict[str, int]]:
    """Roots and children of ``kind`` with ``start <= settled < until``, in SQL written here."""
    hk = HISTORY_KINDS[kind]
    root, settled = hk.root.name, hk.settled_column
    where = f"r.namespace_id = :ns AND r.{settled} < :until"
    if start is not None:
        where += f" AND r.{settled} >= :start"
    params = {"ns": ns, "until": until, "start": start}
    with engine.connect() as conn:
        roots = conn.execute(text(f"SELECT COUNT(*) FROM {root} r WHERE {where}"), params)
        n = int(roots.scalar_one())
        kids = {}
        for child in hk.children:
            q = (
                f"SELECT COUNT(*) FROM {child.table.name} c JOIN {root} r "
                f"ON c.namespace_id = r.namespace_id AND c.{child.parent_column} = r.id "
                f"WHERE {where}"
            )
            kids[child.table.name] = int(conn.execute(text(q), params).scalar_one())
    return n, kids


def _check_counts(engine: Engine, doc: dict[str, Any], ns: bytes) -> None:
    start, until = _ts(doc["range_from"]), _ts(doc["range_until"])
    assert until is not None
    roots, kids = sql_counts(engine, doc["kind"], ns, start, until)
    assert (doc["roots"], doc["children"]) == (roots, kids), doc["kind"]


def test_preview_equals_a_sql_count_of_the_range_on_every_kind_and_writes_nothing(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    ns, q = make_namespace(platform_engine, "preview")
    sid = make_volume(platform_engine, tmp_path / "vol")
    for i, kind in enumerate(HISTORY_KINDS):
        make_plan(platform_engine, ns, kind, sid, batch_size=7, archive_after=ARCHIVE_AFTER)
        seed(platform_engine, ns, q, kind, 40 + 3 * i, seed=i + 1)
    env = orbit_env(mariadb_url)
    before = table_checksums(platform_engine)
    for kind, hk in HISTORY_KINDS.items():
        doc = invoke_json(["plan", "preview", "preview", kind], env)
        now = _ts(doc["now"])
        assert now is not None
        # SPEC §5: until = created_at - archive_after; no earlier success: from the beginning
        assert _ts(doc["range_until"]) == now - timedelta(seconds=ARCHIVE_AFTER)
        assert doc["range_from"] is None
        _check_counts(platform_engine, doc, ns)
        assert 0 < doc["roots"] < 40 + 3 * list(HISTORY_KINDS).index(kind)  # the range cuts
        assert set(doc["children"]) == {c.table.name for c in hk.children}
        if hk.children:
            assert all(n > 0 for n in doc["children"].values()), doc
        assert doc["policy_confirmed"] is True and doc["due"] is True
        assert doc["active_job_id"] is None and doc["tick_action"] == "create_job"
        text_out = invoke_orbit(["plan", "preview", "preview", kind], env)
        assert text_out.exit_code == 0, text_out.stderr
        assert f"roots           {doc['roots']}\n" in text_out.stdout
        assert "range           [beginning, " in text_out.stdout
    assert table_checksums(platform_engine) == before


def test_preview_is_the_range_and_size_of_the_job_a_tick_then_creates(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """The next job archives exactly the previewed roots, into the previewed number of files
    and about the previewed bytes; after it succeeded, the next preview starts at its until."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="preview-job",
            volume=tmp_path / "vol",
            roots=90,
            batch_size=6,
            archive_after=ARCHIVE_AFTER,
        ).parts
        first = invoke_json(["plan", "preview", "preview-job", "tasks"], ae.env)
        job = create_job(ae, ns, "tasks")
        busy = invoke_json(["plan", "preview", "preview-job", "tasks"], ae.env)
        assert busy["active_job_id"] == job.id.hex() and busy["active_job_state"] == "PENDING"
        assert busy["tick_action"] in ("not_due", "coalesced")
        out = runner.run_job(
            ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings, engine=platform_engine,
            publish=lambda *a, **k: None,
        )  # fmt: skip
        assert out == "succeeded"
        done = ae.job(ns, job.id)
        assert done.state is JobState.SUCCEEDED
        with platform_engine.connect() as conn:
            rng = job_store.job_range(conn, done)
        # the job was created after the preview: its range ends a little later, so it holds the
        # previewed roots plus those settled in between (none: seeded times are in the past)
        assert done.roots == first["roots"] > 0
        assert first["estimated_files"] == done.batches + 1  # the manifest and the batches
        assert abs(first["estimated_bytes"] - done.bytes) <= 0.1 * done.bytes, (first, done)
        make_due(platform_engine, ns, "tasks")
        after = invoke_json(["plan", "preview", "preview-job", "tasks"], ae.env)
        assert _ts(after["range_from"]) == rng.until
        _check_counts(platform_engine, after, ns)
        assert after["tick_action"] == "create_job" and after["active_job_id"] is None


def test_preview_bad_input_is_one_line_and_writes_nothing(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    ns, q = make_namespace(platform_engine, "preview-bad")
    sid = make_volume(platform_engine, tmp_path / "vol")
    make_plan(platform_engine, ns, "events", sid)
    env = orbit_env(mariadb_url)
    before = table_checksums(platform_engine)
    cases = [
        (["no-such-ns", "events"], 4, "no-such-ns"),
        (["preview-bad", "nosuchkind"], 2, "nosuchkind"),
        (["preview-bad", "tasks"], 4, "has no 'tasks' plan"),
        (["preview-bad"], 2, "KIND"),
    ]
    for args, code, needle in cases:
        for extra in ([], ["--json"]):
            proc = run_orbit(["plan", "preview", *args, *extra], env)
            assert_one_line_error(proc, code, needle)
    assert table_checksums(platform_engine) == before


def test_preview_text_and_json_shape(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    ns, q = make_namespace(platform_engine, "preview-shape")
    sid = make_volume(platform_engine, tmp_path / "vol")
    make_plan(platform_engine, ns, "events", sid, batch_size=3)
    env = orbit_env(mariadb_url)
    empty = invoke_json(["plan", "preview", "preview-shape", "events"], env)
    assert empty["roots"] == 0 and empty["estimated_files"] == 1  # the manifest alone
    assert empty["children"] == {} and empty["sample_roots"] == 0
    seed(platform_engine, ns, q, "events", 30)
    proc = run_orbit(["plan", "preview", "preview-shape", "events", "--json"], env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    doc = __import__("json").loads(proc.stdout)
    assert proc.stdout.count("\n") == 1  # one JSON object on one line, like `plan show --json`
    assert set(doc) == set(empty)
    assert doc["namespace"] == "preview-shape" and doc["source"] == "primary"
    assert doc["sample_roots"] == min(doc["roots"], 128)
    proc = run_orbit(["plan", "preview", "preview-shape", "events"], env)
    assert proc.returncode == 0, proc.stderr
    keys = [line.split()[0] for line in proc.stdout.splitlines()]
    assert keys == [
        "plan", "now", "range", "roots", "children", "bytes", "files", "max_bytes",
        "batch_size", "source", "enabled", "policy", "due", "active_job", "backlog", "next",
        "controls",
    ]  # fmt: skip


def test_preview_shows_the_controls_over_the_scope(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Paused, throttled, outside its window: read as the gate before a claim reads them; the
    other namespace on the same storage shows only the storage's throttle."""
    ns, q = make_namespace(platform_engine, "preview-ctl")
    other, _ = make_namespace(platform_engine, "preview-free")
    sid = make_volume(platform_engine, tmp_path / "vol")
    make_plan(platform_engine, ns, "events", sid)
    make_plan(platform_engine, other, "events", sid)
    env = orbit_env(mariadb_url)
    free = invoke_json(["plan", "preview", "preview-ctl", "events"], env)
    assert (free["paused"], free["throttled"], free["outside_window"]) == (False, False, False)
    assert free["wait_now"] is None and free["controls"] == []
    assert free["max_roots_per_second"] is None and free["replica_beat_at"] is None
    hour = (_ts(free["now"]) or datetime.min).hour
    closed = f"{(hour + 2) % 24:02d}:00-{(hour + 3) % 24:02d}:00"  # a window that excludes now
    for args in (
        ["archive", "throttle", "--storage", sid.hex(), "--max-roots-per-second", "50"],
        ["archive", "window", "--namespace", "preview-ctl", closed],
    ):
        assert invoke_orbit(args, env).exit_code == 0
    outside = invoke_json(["plan", "preview", "preview-ctl", "events"], env)
    assert outside["throttled"] is True and outside["max_roots_per_second"] == 50
    assert outside["outside_window"] is True and outside["paused"] is False
    assert outside["wait_now"] == "window"
    assert sorted(c["control"] for c in outside["controls"]) == ["throttle", "window"]
    reason = ["--reason", "maintenance"]
    assert (
        invoke_orbit(["archive", "pause", "--namespace", "preview-ctl", *reason], env).exit_code
        == 0
    )
    before = table_checksums(platform_engine)
    paused = invoke_json(["plan", "preview", "preview-ctl", "events"], env)
    assert paused["paused"] is True and paused["wait_now"] == "paused"
    pause = next(c for c in paused["controls"] if c["control"] == "pause")
    assert pause["reason"] == "maintenance" and pause["scope"] == f"*/{ns.hex()}/*"
    text_out = invoke_orbit(["plan", "preview", "preview-ctl", "events"], env).stdout
    assert "controls        PAUSED, throttled to 50 roots/s, OUTSIDE its window" in text_out
    assert "a claim now would wait: paused" in text_out
    neighbour = invoke_json(["plan", "preview", "preview-free", "events"], env)
    assert neighbour["paused"] is False and neighbour["outside_window"] is False
    assert neighbour["throttled"] is True and neighbour["wait_now"] is None
    assert table_checksums(platform_engine) == before
