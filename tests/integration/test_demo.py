"""``make demo`` really works: ``orbit demo`` end to end on the embedded default (SQLite, local
volume, filesystem broker, real worker/beat/API processes), then its results are checked from
the databases and files it left behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from orbit_tasks.archive.engine.verify import verify_job_dir
from orbit_tasks.archive.engine.volume import job_dir
from orbit_tasks.archive.format.expectation import ChainExpectation
from orbit_tasks.db.business_tables import sender_jobs, sender_outbox
from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.history_tables import tasks
from orbit_tasks.db.platform_tables import archive_jobs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_orbit_demo_end_to_end(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.pop("CELERY_BROKER_URL", None)
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "orbit"), "demo", "--dir", str(demo)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Demo complete" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]  # nothing left outside it

    platform = make_engine(f"sqlite:///{demo / 'platform.sqlite3'}")
    business = make_engine(f"sqlite:///{demo / 'business.sqlite3'}")
    try:
        with platform.connect() as conn:
            jobs = conn.execute(select(archive_jobs)).all()
            assert len(jobs) == 3 and {j.state for j in jobs} == {"SUCCEEDED"}
            for job in jobs:
                assert job.attempts == job.batches + 1 and job.roots > 0
                expect = ChainExpectation.from_job_row(job._mapping)
                directory = job_dir(demo / "volume-a", job.namespace_id, job.id)
                report = verify_job_dir(directory, expect)
                assert report.ok, report.reason
            platform_tasks: dict[str, list[str]] = {}
            for r in conn.execute(select(tasks.c.idempotency_key, tasks.c.id)):
                platform_tasks.setdefault(r.idempotency_key, []).append(r.id.hex())
        with business.connect() as conn:
            rows = conn.execute(select(sender_outbox)).all()
            assert len(rows) == 25 and {r.state for r in rows} == {"ACCEPTED"}
            for r in rows:
                assert platform_tasks[r.idempotency_key] == [r.task_id]  # one task per key
            linked = conn.execute(
                select(func.count()).where(sender_jobs.c.task_id.is_not(None))
            ).scalar_one()
            assert linked == 25
    finally:
        platform.dispose()
        business.dispose()
