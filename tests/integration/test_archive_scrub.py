"""The scheduled scrub (issue 28 item 3) with real parts: a real ``orbit beat``, a control worker
running its ticks and an archive worker on the storage's queue find a flipped byte in a job
that became due (its success moved 31 days back, as ``PlanScene.move_next_run`` moves a plan:
no sleeping days), record it, audit it, and the exporter's gauge the alert reads shows it; a
pause stops a running scrub within a second and keeps the job due, a second scrub of the same
storage is refused while the first holds its lease; the read rate stays within +10 % of its bound
(bytes over wall time, MariaDB and SQLite); S3 on moto; bad input is one line, nothing written.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from orbit_tasks.archive.engine.volume import job_dir
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.s3_locations import S3Location
from orbit_tasks.archive.store import scrubs as scrub_store
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import (
    archive_jobs,
    archive_scrub_leases,
    archive_scrubs,
    metadata,
)
from orbit_tasks.metrics.families import Snapshot, build
from orbit_tasks.metrics.sources import PlatformSource
from tests.integration.test_archive_catchup import KIND, _drain, _seed_events, _settings
from tests.integration.test_archive_s3 import aws as aws  # noqa: F401 - fixtures
from tests.integration.test_archive_s3 import s3ae as s3ae  # noqa: F401
from tests.support.archive_jobs import (
    ORBIT,
    REPO,
    ArchiveEnv,
    MiB,
    create_job,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_for,
)
from tests.support.cli import assert_one_line_error, orbit_env, run_orbit
from tests.support.processes import started
from tests.support.s3 import REGION, MotoServer, bucket_name
from tests.support.s3 import moto_fixture as moto_fixture  # noqa: F401 - the session's S3 server
from tests.support.scene import archive_scene, deliver, no_publish

DAY = 86400


def _archived(ae: ArchiveEnv, ns: bytes, kind: str, places: dict[str, Any]) -> Job:
    """The job a tick creates for (ns, kind), delivered by the real runner until SUCCEEDED."""
    job = create_job(ae, ns, kind)
    for _ in range(100):
        if deliver(job, places, ae.settings, engine=ae.engine) == "succeeded":
            break
    done = ae.job(ns, job.id)
    assert done.state is JobState.SUCCEEDED, done
    return done


def _age(engine: Engine, job: Job, days: int) -> None:
    """Test-only: the job succeeded ``days`` earlier (the scrub's clock is the database's)."""
    with engine.begin() as conn:
        conn.execute(
            update(archive_jobs)
            .where(archive_jobs.c.namespace_id == job.namespace_id, archive_jobs.c.id == job.id)
            .values(updated_at=job.updated_at - timedelta(days=days))
        )


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _batch(volume: Path, job: Job, seq: int) -> Path:
    (found,) = job_dir(volume, job.namespace_id, job.id).glob(f"{seq:08d}-*.jsonl.gz")
    return found


def _scrub(engine: Engine, job: Job) -> scrub_store.ScrubRow | None:
    with engine.connect() as conn:
        return scrub_store.get_scrub(conn, job.namespace_id, job.id)


def _snapshot(engine: Engine) -> dict[str, tuple[int, str]]:
    out = {}
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            rows = sorted(repr(tuple(r)) for r in conn.execute(select(table)))
            out[table.name] = (len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest())
    return out


def _gauges(engine: Engine, storage: bytes) -> dict[str, float]:
    """The exporter's scrub families for ``storage``, as one scrape builds them."""
    reading = PlatformSource(engine, tick_seconds=60).read()
    snap = Snapshot(platform=reading, business=None, broker=None, business_configured=False)
    out = {}
    for fam in build(snap):
        if fam.name.startswith("orbit_archive_scrub_"):
            for s in fam.samples:
                if s.labels.get("storage") == storage.hex():
                    out[fam.name] = s.value
    return out


@pytest.mark.mariadb
@pytest.mark.redis
def test_beat_scrubs_a_due_job_finds_a_flipped_byte_and_the_gauge_shows_it(
    ae: ArchiveEnv, tmp_path: Path
) -> None:
    vol = tmp_path / "vol"
    scene = archive_scene(ae.engine, name="rot", volume=vol, roots=60, batch_size=5)
    places = {scene.storage.hex(): vol}
    rotten = _archived(ae, scene.ns, "tasks", places)
    fine_ns, queue = make_namespace(ae.engine, "fine")
    make_plan(ae.engine, fine_ns, "events", scene.storage)
    seed(ae.engine, fine_ns, queue, "events", 40)
    fine = _archived(ae, fine_ns, "events", places)
    flipped = _batch(vol, rotten, 2)
    _flip(flipped)
    assert _gauges(ae.engine, scene.storage) == {
        "orbit_archive_scrub_oldest_verified_seconds": pytest.approx(0, abs=120),
        "orbit_archive_scrub_failed_jobs": 0.0,
    }
    for job in (rotten, fine):
        _age(ae.engine, job, 31)  # one scrub period (30 days) and a day ago
    ae.worker("arch", [vol])
    ae.worker("ctl", [])
    env = {k: v for k, v in ae.env.items() if k != "ORBIT_SENDER_DATABASE_URL"}  # archive only
    env["ORBIT_TICK_SECONDS"] = "1"
    with started([ORBIT, "beat"], env, tmp_path / "beat.log") as beat:
        bad = wait_for(
            lambda: (r := _scrub(ae.engine, rotten)) is not None and r, 90, "the rotten job's scrub"
        )
        wait_for(lambda: _scrub(ae.engine, fine) is not None, 60, "the good job's scrub")
        assert beat.proc.poll() is None, beat.text()
    assert bad.outcome.value == "bad" and bad.verified_at is None and bad.failures == 1
    assert bad.first_bad_file == flipped.name and "sha256" in bad.reason.lower()
    good = _scrub(ae.engine, fine)
    assert good is not None and good.outcome.value == "ok" and good.verified_at is not None
    assert good.bytes_read == fine.bytes and good.files_read == fine.batches + 1
    assert (good.range_until, good.from_id) != (None, None) or good.range_until is not None
    with ae.engine.connect() as conn:
        audits = conn.execute(
            select(audit_events.c.action, audit_events.c.target_id, audit_events.c.detail_json)
            .where(audit_events.c.action == "archive.job.scrub_failed")
        ).all()  # fmt: skip
    assert [(a.target_id, json.loads(a.detail_json)["first_bad_file"]) for a in audits] == [
        (rotten.id.hex(), flipped.name)
    ]
    gauges = _gauges(ae.engine, scene.storage)
    assert gauges["orbit_archive_scrub_failed_jobs"] == 1.0  # the alert's expression: > 0
    assert gauges["orbit_archive_scrub_oldest_verified_seconds"] >= 31 * DAY  # still unverified
    assert "archive.scrub.failed" in ae.workers[0].text()
    # nothing was rewritten: the job row as it was, the damaged file as found
    assert ae.job(rotten.namespace_id, rotten.id).revision == rotten.revision
    assert flipped.exists()


@pytest.mark.mariadb
@pytest.mark.redis
def test_the_tick_wakes_no_scrub_under_a_pause_and_a_pause_stops_a_running_one(
    ae: ArchiveEnv, tmp_path: Path
) -> None:
    vol = tmp_path / "vol"
    scene = archive_scene(ae.engine, name="hold", volume=vol, roots=5)
    make_plan(ae.engine, scene.ns, KIND, scene.storage, batch_size=100)
    _seed_events(ae.engine, scene.ns, 12_000)
    job = _archived(ae, scene.ns, KIND, {scene.storage.hex(): vol})
    assert job.bytes > 800_000, job.bytes  # over 12 s at 64 KiB/s
    _age(ae.engine, job, 31)
    woken: list[bytes] = []

    def tick() -> int:
        return run_tick(
            ae.engine, ae.settings, no_publish, scrub_publish=woken.append
        ).scrub_wakeups

    sid = scene.storage.hex()
    ae.orbit("archive", "pause", "--storage", sid, "--reason", "disk swap")
    assert tick() == 0 and woken == []
    ae.orbit("archive", "resume", "--storage", sid)
    assert tick() == 1 and woken == [scene.storage]

    slow = {**ae.env, "ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND": "64KiB"}
    args = [ORBIT, "archive", "scrub", "hold", job.id.hex(), "--volume", str(vol), "--json"]
    proc = subprocess.Popen(
        args, cwd=REPO, env=slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: _holder(ae.engine, scene.storage), 20, "the scrub's lease")
        assert tick() == 0  # a scrub holds the storage: no second wake-up
        busy = ae.orbit("archive", "scrub", "--volume", str(vol), check=False)
        assert busy.returncode == 3 and "another scrub holds storage" in busy.stdout, busy
        ae.orbit("archive", "pause", "--namespace", "hold", "--reason", "incident")
        paused_at = time.monotonic()
        out, err = proc.communicate(timeout=30)
        stopped_in = time.monotonic() - paused_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, (out, err)
    assert stopped_in < 3.0, stopped_in  # checked at least once a second
    assert json.loads(out)["storages"][0]["stop"] == "paused"
    assert _scrub(ae.engine, job) is None  # nothing recorded: the job stays due
    assert not _holder(ae.engine, scene.storage)  # the lease was given back
    ae.orbit("archive", "resume", "--namespace", "hold")
    done = ae.orbit("archive", "scrub", "--volume", str(vol), "--json")
    assert [r["job_id"] for r in json.loads(done.stdout)["results"]] == [job.id.hex()]
    row = _scrub(ae.engine, job)
    assert row is not None and row.outcome.value == "ok"


def _holder(engine: Engine, storage: bytes) -> bool:
    with engine.connect() as conn:
        row = conn.execute(
            select(archive_scrub_leases.c.lease_id).where(
                archive_scrub_leases.c.storage_id == storage
            )
        ).first()
    return row is not None and row.lease_id is not None


def test_the_scrub_holds_its_read_rate(
    any_platform_engine: Engine, any_platform_url: str, tmp_path: Path
) -> None:
    """Bytes over the command's wall time (start-up included) stay within +10 % of the bound,
    and the scrub is not much slower than it either."""
    engine, url = any_platform_engine, any_platform_url
    ns, _q = make_namespace(engine, "rate")
    vol = tmp_path / "vol"
    sid = make_volume(engine, vol, "rate")
    _seed_events(engine, ns, 40_000)
    make_plan(engine, ns, KIND, sid, batch_size=100, max_bytes=64 * MiB)
    assert "failed" not in _drain(engine, _settings(url, tmp_path), {sid.hex(): vol})
    with engine.connect() as conn:
        (job_id, size) = conn.execute(select(archive_jobs.c.id, archive_jobs.c.bytes)).one()
    assert size > 2 * MiB, size  # a few MiB
    rate = MiB
    env = orbit_env(url, ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND="1MiB/s")
    began = time.monotonic()
    args = ["archive", "scrub", "rate", bytes(job_id).hex(), "--volume", str(vol), "--json"]
    proc = run_orbit(args, env)
    elapsed = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(proc.stdout)["results"]
    assert result["outcome"] == "ok" and result["bytes_read"] == size
    assert size / elapsed <= 1.10 * rate, (size, elapsed)
    assert result["bytes_per_second"] <= 1.10 * rate, result
    assert result["bytes_per_second"] >= 0.50 * rate, (
        result
    )  # bounded, not stalled (CPU-bound verify on a shared machine)
    with engine.connect() as conn:
        row = conn.execute(select(archive_scrubs)).one()
    assert row.bytes_read == size and row.read_ms >= 1000 * size / (1.1 * rate)


@pytest.mark.mariadb
@pytest.mark.redis
def test_a_scrub_on_s3_names_the_object_that_changed(
    s3ae: ArchiveEnv,
    aws: MotoServer,  # noqa: F811
) -> None:
    ae, moto = s3ae, aws
    bucket = moto.bucket(bucket_name("scrub"))
    url = f"s3://{bucket}/arch"
    doc = json.loads(ae.orbit(*moto.init_args(url), "--json").stdout)
    sid = bytes.fromhex(doc["id"])
    loc = S3Location(bucket, "arch", moto.endpoint, REGION, True)
    ns, queue = make_namespace(ae.engine, "cloud")
    make_plan(ae.engine, ns, "tasks", sid)
    seed(ae.engine, ns, queue, "tasks", 30)
    job = _archived(ae, ns, "tasks", {sid.hex(): loc})
    ok = ae.orbit("archive", "scrub", "cloud", job.id.hex(), "--volume", url, "--json")
    assert json.loads(ok.stdout)["results"][0]["outcome"] == "ok"
    prefix = loc.key(f"{ns.hex()}/{job.id.hex()}/")
    key = next(k for k in moto.keys(bucket, prefix) if k.rsplit("/", 1)[1].startswith("00000003-"))
    body = bytearray(moto.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0x01
    moto.client().put_object(Bucket=bucket, Key=key, Body=bytes(body))
    bad = ae.orbit("archive", "scrub", "cloud", job.id.hex(), "--volume", url, check=False)
    assert bad.returncode == 1, (bad.stdout, bad.stderr)
    assert f"BAD: job {job.id.hex()}: {key.rsplit('/', 1)[1]}" in bad.stdout
    row = _scrub(ae.engine, job)
    assert row is not None and row.outcome.value == "bad" and row.failures == 1


@pytest.mark.mariadb
def test_scrub_bad_input_is_one_line_and_writes_nothing(ae: ArchiveEnv, tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    scene = archive_scene(ae.engine, name="bad", volume=vol, roots=10)
    job = _archived(ae, scene.ns, "tasks", {scene.storage.hex(): vol})
    other = tmp_path / "other"
    make_volume(ae.engine, other, "other")
    waiting_ns, _q = make_namespace(ae.engine, "waiting")
    make_plan(ae.engine, waiting_ns, "tasks", scene.storage)
    pending = create_job(ae, waiting_ns, "tasks")  # PENDING: nobody delivers it
    before = _snapshot(ae.engine)
    j = job.id.hex()
    cases = [
        (["bad", "xyz", "--volume", str(vol)], {}, 2, "job id"),
        (["nosuch", j, "--volume", str(vol)], {}, 4, "nosuch"),
        (["bad", "ab" * 16, "--volume", str(vol)], {}, 4, "ab" * 16),
        (["bad", j, "--volume", str(other)], {}, 2, "does not hold storage"),
        (["bad", j, "--volume", str(tmp_path / "none")], {}, 2, "none"),
        (["bad", j], {}, 2, "--volume"),
        (["waiting", pending.id.hex(), "--volume", str(vol)], {}, 3, "only SUCCEEDED"),
        (["bad", j, "--volume", str(vol)], {"ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND": "fast"}, 2,
         "ORBIT_ARCHIVE_SCRUB_BYTES_PER_SECOND"),
        (["bad", j, "--volume", str(vol)], {"ORBIT_ARCHIVE_SCRUB_DAYS": "-3"}, 2,
         "ORBIT_ARCHIVE_SCRUB_DAYS"),
    ]  # fmt: skip
    for args, extra, code, needle in cases:
        proc = subprocess.run(
            [ORBIT, "archive", "scrub", *args], cwd=REPO, env={**ae.env, **extra},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert_one_line_error(proc, code, needle)
    assert _snapshot(ae.engine) == before


@pytest.mark.mariadb
def test_with_self_repair_on_a_flipped_byte_is_rebuilt_from_the_source_and_verified(
    ae: ArchiveEnv, tmp_path: Path
) -> None:
    vol = tmp_path / "vol"
    scene = archive_scene(ae.engine, name="mend", volume=vol, roots=30, batch_size=5)
    job = _archived(ae, scene.ns, "tasks", {scene.storage.hex(): vol})
    damaged = _batch(vol, job, 3)
    original = damaged.read_bytes()
    _flip(damaged)
    env = {**ae.env, "ORBIT_ARCHIVE_SCRUB_REPAIR": "1"}
    proc = subprocess.run(
        [ORBIT, "archive", "scrub", "mend", job.id.hex(), "--volume", str(vol), "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    (result,) = json.loads(proc.stdout)["results"]
    assert result["outcome"] == "repaired" and result["first_bad_file"] == damaged.name
    assert damaged.read_bytes() == original  # the original bytes, proven by the chain
    row = _scrub(ae.engine, job)
    assert row is not None and row.outcome.value == "repaired" and row.verified_at is not None
    with ae.engine.connect() as conn:
        actions = [
            a for (a,) in conn.execute(
                select(audit_events.c.action).where(audit_events.c.target_id == job.id.hex())
            )
        ]  # fmt: skip
    assert actions == ["archive.job.repair"]  # repaired: no scrub failure to page for
