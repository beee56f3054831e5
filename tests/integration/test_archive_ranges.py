"""The fixed-range rule across policy changes (SPEC §5, issue 7 item 1), on SQLite and MariaDB.

``from`` is the greatest ``until`` among all SUCCEEDED jobs of the (namespace, kind) created
before the job, each with its own policy revision. Real ticks create the jobs, the real runner
archives them into real files, and the union of every SUCCEEDED job's export must hold every
settled root of the archived span exactly once, whatever the policy history and whichever
storage each job went to.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select

from orbit_tasks.archive import claims
from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.engine.verify import export_roots
from orbit_tasks.archive.engine.volume import job_dir
from orbit_tasks.archive.format.expectation import ChainExpectation
from orbit_tasks.archive.format.values import format_ts
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.db.engine import db_now
from orbit_tasks.dev import generator
from orbit_tasks.platform import store
from orbit_tasks.platform.history import HISTORY_KINDS
from orbit_tasks.settings import Settings, load_settings
from orbit_tasks.units import parse_duration
from tests.support.archive_jobs import (
    ORBIT,
    REPO,
    make_due,
    make_namespace,
    make_volume,
    seed,
)

pytestmark = [pytest.mark.mariadb]
KIND = "tasks"
HK = HISTORY_KINDS[KIND]


@pytest.fixture
def engine(any_platform_engine: Engine) -> Engine:
    return any_platform_engine


def _settings(url: str, tmp: Path) -> Settings:
    return load_settings({"ORBIT_DATABASE_URL": url, "ORBIT_VAR_DIR": str(tmp / "var")})


def _confirm_policy(engine: Engine, ns: bytes, after: str, storage: bytes) -> None:
    """``orbit policy set`` then ``orbit plan set --policy-revision`` (confirming it)."""
    with engine.begin() as conn:
        rev = store.add_policy_revision(conn, ns, KIND, parse_duration(after), "test")
        plan_store.set_plan(
            conn, ns, KIND, storage_id=storage, interval=86400, batch_size=7,
            max_bytes=64 * 1024 * 1024, policy_revision=rev, enabled=True,
            expect_revision=None, now=db_now(conn), actor="test",
        )  # fmt: skip


def _seed_at(engine: Engine, ns: bytes, q: bytes, settled: list[datetime], seed: int) -> None:
    """Settled task roots at exactly the given times (with their attempts)."""
    spec = generator.make_spec(KIND, len(settled), days=1, settled_fraction=1.0)
    with engine.begin() as conn:
        chunk = next(generator.generate(spec, ns, [q], random.Random(seed), db_now(conn)))
        for root, at in zip(chunk.roots, settled, strict=True):
            root[HK.settled_column] = at
        conn.execute(insert(HK.root), chunk.roots)
        conn.execute(insert(HK.children[0].table), chunk.children)


def _expectation(engine: Engine, job: Job) -> ChainExpectation:
    with engine.connect() as conn:
        rng = job_store.job_range(conn, job)
    expect = claims.chain_expectation(job, complete=job.state is JobState.SUCCEEDED)
    return replace(expect, range=(rng.from_, rng.until))


def _cli(url: str, tmp: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    env.update(ORBIT_DATABASE_URL=url, ORBIT_VAR_DIR=str(tmp / "var"))
    proc = subprocess.run(
        [ORBIT, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


@pytest.mark.parametrize(
    "policies, switch_storage_before",
    [
        (("1h", "30d", "1h"), None),
        (("1h", "30d", "1h"), 1),  # the plan moves to another storage before the 30d job
        (("1h", "1h"), 1),
    ],
    ids=["1h-30d-1h", "1h-30d-1h-storage-switch", "1h-1h-storage-switch"],
)
def test_union_of_succeeded_jobs_holds_every_settled_root_exactly_once(
    engine: Engine,
    any_platform_url: str,
    tmp_path: Path,
    policies: tuple[str, ...],
    switch_storage_before: int | None,
) -> None:
    settings = _settings(any_platform_url, tmp_path)
    ns, q = make_namespace(engine, "ranges")
    vols = [tmp_path / "vol-a", tmp_path / "vol-b"]
    sids = [make_volume(engine, v, v.name) for v in vols]
    seed(engine, ns, q, KIND, 30)
    done: list[tuple[Job, Path]] = []
    storage = 0
    for i, after in enumerate(policies):
        if i == switch_storage_before:
            storage = 1
        if done:  # roots settling right at and after the archived span's end
            with engine.connect() as conn:
                end = max(job_store.job_range(conn, j).until for j, _ in done)
            _seed_at(engine, ns, q, [end + timedelta(microseconds=k) for k in range(3)], i)
        _confirm_policy(engine, ns, after, sids[storage])
        make_due(engine, ns, KIND)
        report = run_tick(engine, settings, publish=lambda *a, **k: None)
        ((_, _, job_hex),) = report.jobs_created
        job_id = bytes.fromhex(job_hex)
        outcome = runner.run_job(
            ns.hex(), job_hex, {sids[storage].hex(): vols[storage]}, settings,
            engine=engine, publish=lambda *a, **k: None,
        )  # fmt: skip
        assert outcome == "succeeded"
        with engine.connect() as conn:
            job = job_store.require_job(conn, ns, job_id)
        assert job.state is JobState.SUCCEEDED
        done.append((job, vols[storage]))

    with engine.connect() as conn:
        ranges = [job_store.job_range(conn, j) for j, _ in done]
    # each range starts at the greatest until of the successes before it
    for k in range(1, len(done)):
        assert ranges[k].from_ == max(r.until for r in ranges[:k])
    exported: list[bytes] = []
    for job, vol in done:
        lines = export_roots(job_dir(vol, ns, job.id), _expectation(engine, job))
        exported += [bytes.fromhex(obj["root"]["id"]) for obj in lines]
    span_until = max(r.until for r in ranges)
    with engine.connect() as conn:
        settled = conn.execute(
            select(HK.root.c.id).where(
                HK.root.c.namespace_id == ns,
                HK.settled < span_until,
            )
        ).all()
    assert len(exported) == len(set(exported)), "a root was archived by two SUCCEEDED jobs"
    assert sorted(exported) == sorted(bytes(r[0]) for r in settled)

    if switch_storage_before is not None:  # the operator commands derive the same ranges
        last, last_vol = done[-1]
        shown = json.loads(_cli(any_platform_url, tmp_path, "job", "show", ns.hex(),
                                last.id.hex(), "--json"))  # fmt: skip
        assert shown["range"] == {
            "from": format_ts(ranges[-1].from_),  # type: ignore[arg-type]
            "until": format_ts(ranges[-1].until),
        }
        via_cli: list[bytes] = []
        for job, vol in done:
            verified = json.loads(_cli(any_platform_url, tmp_path, "job", "verify", ns.hex(),
                                       job.id.hex(), "--volume", str(vol), "--json"))  # fmt: skip
            assert verified["ok"] is True
            out = _cli(any_platform_url, tmp_path, "job", "export", ns.hex(), job.id.hex(),
                       "--volume", str(vol))  # fmt: skip
            via_cli += [bytes.fromhex(json.loads(ln)["root"]["id"]) for ln in out.splitlines()]
        assert via_cli == exported
        assert last_vol == vols[1]
