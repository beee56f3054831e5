"""``orbit archive coverage`` (issue 28 item 2), on SQLite and MariaDB: the archived ranges of a
plan with several real jobs (a budget-sized catch-up run by the real runner), in order, each
with its job, storage, roots, files, bytes and last verification; a deliberately removed job
row shows as the gap it left (exit 1) once a scrub proved the ranges from the manifests;
``--all`` over every namespace; bad input is one line with the right exit code, nothing
written; the plan's statement reads ``ix_archive_job_list``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, select, text

from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import coverage as coverage_store
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.db.platform_tables import archive_jobs, metadata
from orbit_tasks.timestamps import format_ts
from tests.integration.test_archive_catchup import KIND, _drain, _seed_events, _settings
from tests.support.archive_jobs import MiB, make_namespace, make_plan, make_volume
from tests.support.cli import assert_one_line_error, invoke_json, invoke_orbit, orbit_env, run_orbit


def _snapshot(engine: Engine) -> dict[str, tuple[int, str]]:
    """Row count and digest of every platform table: equal snapshots = nothing written."""
    out = {}
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            rows = sorted(repr(tuple(r)) for r in conn.execute(select(table)))
            out[table.name] = (len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest())
    return out


def _jobs(engine: Engine, ns: bytes) -> list[Job]:
    with engine.connect() as conn:
        return job_store.list_jobs(conn, ns, limit=1000)[0]


def _range(engine: Engine, job: Job) -> ArchiveRange:
    with engine.connect() as conn:
        return job_store.job_range(conn, job)


def _bound(at: Any, root_id: bytes | None) -> dict[str, Any] | None:
    return {"at": format_ts(at), "id": None if root_id is None else root_id.hex()}


def _catch_up(
    engine: Engine, url: str, tmp_path: Path, name: str, events: int
) -> tuple[bytes, bytes, Path]:
    """A namespace whose events plan archived ``events`` roots as consecutive 1 MiB jobs."""
    ns, _q = make_namespace(engine, name)
    vol = tmp_path / f"vol-{name}"
    sid = make_volume(engine, vol, f"label-{name}")
    _seed_events(engine, ns, events)
    make_plan(engine, ns, KIND, sid, batch_size=100, max_bytes=1 * MiB)
    outcomes = _drain(engine, _settings(url, tmp_path), {sid.hex(): vol})
    assert "failed" not in outcomes, outcomes
    return ns, sid, vol


def test_coverage_lists_the_ranges_in_order_and_a_removed_job_row_is_a_gap(
    any_platform_engine: Engine, any_platform_url: str, tmp_path: Path
) -> None:
    engine, url = any_platform_engine, any_platform_url
    ns, sid, vol = _catch_up(engine, url, tmp_path, "cov", 25_000)
    jobs = _jobs(engine, ns)
    assert len(jobs) >= 3 and all(j.state is JobState.SUCCEEDED for j in jobs)
    env = orbit_env(url)
    before = _snapshot(engine)
    doc = invoke_json(["archive", "coverage", "cov", KIND], env)
    assert _snapshot(engine) == before  # coverage reads only
    assert doc["ok"] is True and doc["gaps"] == [] and doc["overlaps"] == []
    assert [r["job_id"] for r in doc["ranges"]] == [j.id.hex() for j in jobs]
    for item, job in zip(doc["ranges"], jobs, strict=True):
        rng = _range(engine, job)
        assert item["from"] == (None if rng.from_ is None else _bound(rng.from_, rng.from_id))
        assert item["until"] == _bound(rng.until, rng.until_id)
        assert (item["roots"], item["files"], item["bytes"]) == (
            job.roots, job.batches + 1, job.bytes,
        )  # fmt: skip
        assert item["storage_id"] == sid.hex() and item["storage"] == "label-cov"
        assert item["range_source"] == "derived" and item["last_scrub"] is None
        assert item["last_verified"] == item["succeeded_at"]  # the runner's own final check
    assert doc["ranges"][0]["from"] is None  # from the beginning of time
    assert doc["roots"] == sum(j.roots for j in jobs)
    assert doc["backlog"]["roots"] == 0  # caught up: nothing settled is left unarchived
    text_out = invoke_orbit(["archive", "coverage", "cov", KIND], env)
    assert text_out.exit_code == 0 and f"{len(jobs)} archived range(s)" in text_out.stdout

    # a scrub proves each range from its manifest; coverage then shows the proven ranges
    for job in jobs:
        done = invoke_orbit(["archive", "scrub", "cov", job.id.hex(), "--volume", str(vol)], env)
        assert done.exit_code == 0, (done.stdout, done.stderr)
    proven = invoke_json(["archive", "coverage", "cov", KIND], env)
    assert proven["ok"] is True
    assert [r["range_source"] for r in proven["ranges"]] == ["scrub"] * len(jobs)
    assert [(r["from"], r["until"]) for r in proven["ranges"]] == [
        (r["from"], r["until"]) for r in doc["ranges"]
    ]
    assert all(r["last_scrub"]["outcome"] == "ok" for r in proven["ranges"])

    # a job row removed by hand: the range it archived is nobody's now
    middle = jobs[1]
    with engine.begin() as conn:
        conn.execute(
            delete(archive_jobs).where(
                archive_jobs.c.namespace_id == ns, archive_jobs.c.id == middle.id
            )
        )
    gap = invoke_orbit(["archive", "coverage", "cov", KIND, "--json"], env)
    assert gap.exit_code == 1, (gap.stdout, gap.stderr)
    found = json.loads(gap.stdout)
    assert found["ok"] is False and found["overlaps"] == []
    removed = next(r for r in doc["ranges"] if r["job_id"] == middle.id.hex())
    assert found["gaps"] == [
        {
            "kind": "gap", "from": removed["from"], "until": removed["until"],
            "after_job": jobs[0].id.hex(), "before_job": jobs[2].id.hex(),
        }
    ]  # fmt: skip
    people = invoke_orbit(["archive", "coverage", "cov", KIND], env)
    assert people.exit_code == 1 and "GAP: " in people.stdout


def test_coverage_all_gives_every_plan_of_every_namespace(
    any_platform_engine: Engine, any_platform_url: str, tmp_path: Path
) -> None:
    engine, url = any_platform_engine, any_platform_url
    _catch_up(engine, url, tmp_path, "one", 300)
    ns2, _q = make_namespace(engine, "two")
    sid2 = make_volume(engine, tmp_path / "vol-two", "two")
    make_plan(engine, ns2, "tasks", sid2)  # a plan with no job yet: nothing archived
    doc = invoke_json(["archive", "coverage", "--all"], orbit_env(url))
    assert sorted(doc) == ["items", "next", "ok"] and doc["next"] is None and doc["ok"] is True
    by = {(d["namespace"], d["kind"]): d for d in doc["items"]}
    assert set(by) == {("one", KIND), ("two", "tasks")}
    assert len(by[("one", KIND)]["ranges"]) == 1 and by[("one", KIND)]["ranges"][0]["roots"] > 0
    assert by[("two", "tasks")]["ranges"] == [] and by[("two", "tasks")]["gaps"] == []


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["nosuch", "tasks"], 4, "nosuch"),
        (["acme", "nokind"], 2, "nokind"),
        (["acme"], 2, "NS KIND"),
        (["acme", "tasks", "--all"], 2, "--all"),
        ([], 2, "--all"),
        (["acme", "workflows"], 4, "no workflows plan"),
    ],
)
def test_coverage_bad_input_is_one_line_and_writes_nothing(
    any_platform_engine: Engine, any_platform_url: str, tmp_path: Path, args: list[str],
    code: int, needle: str,
) -> None:  # fmt: skip
    ns, _q = make_namespace(any_platform_engine, "acme")
    make_plan(any_platform_engine, ns, "tasks", make_volume(any_platform_engine, tmp_path / "v"))
    before = _snapshot(any_platform_engine)
    proc = run_orbit(["archive", "coverage", *args], orbit_env(any_platform_url))
    assert_one_line_error(proc, code, needle)
    assert _snapshot(any_platform_engine) == before


@pytest.mark.mariadb
def test_the_coverage_statement_reads_the_job_list_index(platform_engine: Engine) -> None:
    query = coverage_store.coverage_query(b"\x01" * 16, "tasks")
    with platform_engine.connect() as conn:
        sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        rows = conn.execute(text("EXPLAIN " + sql)).mappings().all()
    jobs = [r for r in rows if r["table"] in ("orbit_archive_jobs", "j", "J")] or rows[:1]
    assert jobs[0]["key"] == "ix_archive_job_list" and jobs[0]["type"] != "ALL", rows
    assert all(r["type"] != "ALL" for r in rows), rows  # the joins by primary key
