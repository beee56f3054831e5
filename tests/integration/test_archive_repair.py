"""``orbit job repair`` (issue 24 item 3): missing and corrupt files of a job rebuilt from the
source rows, kept only when they hash to the chain's links. Real MariaDB, folders and moto's S3
server, the real ``orbit`` script; the jobs run in-process (the runner itself).

A finished job with files deleted and corrupted -> restored byte for byte, ``job verify``
passes, audited; a job FAILED ``CHAIN_BROKEN`` -> repaired, retried, SUCCEEDED; a changed
source row -> the file is named, exit 1, nothing written; ``--dry-run`` writes nothing; bad
input is one line with its exit code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text, update

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.engine.storage import FolderStorage, JobFiles, Place, Storage
from orbit_tasks.archive.format.names import parse_name
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.s3_locations import S3Location
from orbit_tasks.db.history_tables import audit_events, tasks
from tests.support.archive_jobs import (
    ArchiveEnv,
    archive_env,
    assert_succeeded_exactly,
    create_job,
    expectation,
    make_namespace,
    make_plan,
    make_volume,
    seed,
)
from tests.support.cli import assert_one_line_error
from tests.support.s3 import REGION, MotoServer, bucket_name
from tests.support.s3 import moto_fixture as moto_fixture  # the session's S3 server

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]


@pytest.fixture
def s3ae(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, moto: MotoServer,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ArchiveEnv]:  # fmt: skip
    for k, v in moto.env().items():
        monkeypatch.setenv(k, v)
    with archive_env(mariadb_url, platform_engine, tmp_path, **moto.env()) as env:
        yield env


def _run(ae: ArchiveEnv, job: Job, sid: bytes, place: Place) -> str:
    """Deliveries of the runner in-process until the job is not released any more."""
    out = None
    while out in (None, "released"):
        out = runner.run_job(
            job.namespace_id.hex(), job.id.hex(), {sid.hex(): place}, ae.settings,
            engine=ae.engine, publish=lambda *a, **k: None,
        )  # fmt: skip
    return str(out)


def _tasks_job(ae: ArchiveEnv, name: str, sid: bytes) -> Job:
    """A namespace ``name`` with a plan of 30 tasks on storage ``sid``, and the job of a tick."""
    ns, queue = make_namespace(ae.engine, name)
    make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
    seed(ae.engine, ns, queue, "tasks", 30)
    return create_job(ae, ns, "tasks")


def _folder_job(ae: ArchiveEnv, name: str) -> tuple[Job, bytes, Path]:
    vol = ae.tmp / f"vol-{name}"
    sid = make_volume(ae.engine, vol)
    return _tasks_job(ae, name, sid), sid, vol


def _chain(d: JobFiles) -> dict[int, tuple[str, bytes]]:
    """The job directory's files by position (a finished job holds exactly its chain)."""
    out: dict[int, tuple[str, bytes]] = {}
    for n in d.names():
        parsed = parse_name(n)
        assert parsed is not None and parsed.seq not in out, n
        out[parsed.seq] = (n, d.read(n))
    return out


def _damage(d: JobFiles, storage: Storage, chain: dict[int, tuple[str, bytes]]) -> list[str]:
    """Delete the manifest and the tail, corrupt a middle file (one flipped byte, same name)."""
    last = max(chain)
    gone = [chain[0][0], chain[last][0]]
    d.remove(gone)
    name, data = chain[last // 2]
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x01
    if isinstance(storage, FolderStorage):
        (Path(d.where) / name).write_bytes(bytes(bad))
    else:
        d.remove([name])
        _put_raw(d, name, bytes(bad))
    return [*gone, name]


def _put_raw(d: Any, name: str, data: bytes) -> None:
    """An object under ``name`` with other bytes (what a lossy store may hold)."""
    d._client.get().put_object(Bucket=d._loc.bucket, Key=d.prefix + name, Body=bytes(data))


def _repair(ae: ArchiveEnv, job: Job, where: str, *extra: str) -> Any:
    return ae.orbit("job", "repair", job.namespace_id.hex(), job.id.hex(), "--volume", where,
                    *extra, check=False)  # fmt: skip


def _audits(ae: ArchiveEnv, job: Job) -> list[dict[str, Any]]:
    with ae.engine.connect() as conn:
        rows = conn.execute(
            select(audit_events.c.action, audit_events.c.detail_json).where(
                audit_events.c.target_id == job.id.hex(),
                audit_events.c.action == "archive.job.repair",
            )
        ).all()
    return [json.loads(r.detail_json) for r in rows]


def _cycle(ae: ArchiveEnv, job: Job, sid: bytes, place: Place, where: str) -> None:
    """Finish the job, damage three files, dry-run, repair, verify: byte for byte."""
    storage = runner._open(place, ae.settings)
    assert _run(ae, job, sid, place) == "succeeded"
    done = ae.job(job.namespace_id, job.id)
    assert done.batches >= 6, done
    d = storage.job(done.namespace_id, done.id)
    before = _chain(d)
    damaged = _damage(d, storage, before)
    assert ae.orbit("job", "verify", done.namespace_id.hex(), done.id.hex(), "--volume", where,
                    check=False).returncode == 1  # fmt: skip

    dry = _repair(ae, done, where, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert doc["ok"] and doc["dry_run"]
    assert sorted(f["name"] for f in doc["files"]) == sorted(damaged)
    assert {f["action"] for f in doc["files"]} == {"would_rebuild"}
    assert {f["found"] for f in doc["files"]} == {"missing", "corrupt"}
    assert before[0][0] not in d.names() and _audits(ae, done) == []  # nothing written

    fixed = _repair(ae, done, where, "--json")
    assert fixed.returncode == 0, fixed.stderr
    assert {f["action"] for f in json.loads(fixed.stdout)["files"]} == {"rebuilt"}
    assert _chain(d) == before  # byte for byte, nothing else
    ok = ae.orbit("job", "verify", done.namespace_id.hex(), done.id.hex(), "--volume", where)
    assert ok.stdout.startswith("ok:")
    assert_succeeded_exactly(ae, done, storage)
    (audit,) = _audits(ae, done)
    assert sorted(audit["rebuilt"]) == sorted({0, max(before), max(before) // 2})
    again = _repair(ae, done, where)
    assert again.returncode == 0 and "nothing to repair" in again.stdout
    assert len(_audits(ae, done)) == 1


def test_repair_restores_deleted_and_corrupt_files_of_a_folder_job(ae: ArchiveEnv) -> None:
    job, sid, vol = _folder_job(ae, "repair-folder")
    _cycle(ae, job, sid, vol, str(vol))


def test_repair_restores_deleted_and_corrupt_objects_on_s3(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    ae = s3ae
    bucket = moto.bucket(bucket_name("repair"))
    url = f"s3://{bucket}/r"
    doc = json.loads(ae.orbit(*moto.init_args(url), "--json").stdout)
    sid = bytes.fromhex(doc["id"])
    job = _tasks_job(ae, "repair-s3", sid)
    _cycle(ae, job, sid, S3Location(bucket, "r", moto.endpoint, REGION, True), url)


def test_a_chain_broken_job_is_repaired_then_retried_to_success(ae: ArchiveEnv) -> None:
    """A confirmed file lost while the job runs: its final step fails CHAIN_BROKEN; the repair
    puts it back and a retry finishes the job."""
    job, sid, vol = _folder_job(ae, "repair-failed")
    settings = ae.settings.with_overrides(archive_slice_seconds=0)  # one file per delivery
    for _ in range(3):
        out = runner.run_job(job.namespace_id.hex(), job.id.hex(), {sid.hex(): vol}, settings,
                             engine=ae.engine, publish=lambda *a, **k: None)  # fmt: skip
        assert out == "released"
    d = FolderStorage(vol).job(job.namespace_id, job.id)
    lost = sorted(n for n in d.names() if parse_name(n).seq == 1)  # type: ignore[union-attr]
    original = d.read(lost[0])
    d.remove(lost)
    assert _run(ae, job, sid, vol) == "failed"
    failed = ae.job(job.namespace_id, job.id)
    assert (failed.state, failed.error_code) == (JobState.FAILED, "CHAIN_BROKEN")
    out = _repair(ae, failed, str(vol))
    assert out.returncode == 0, out.stderr
    assert f"rebuilt: {lost[0]} (missing)" in out.stdout and "orbit job retry" in out.stdout
    assert d.read(lost[0]) == original
    ae.orbit("job", "retry", job.namespace_id.hex(), job.id.hex())
    assert _run(ae, job, sid, vol) == "succeeded"
    assert_succeeded_exactly(ae, ae.job(job.namespace_id, job.id), vol)


def test_a_changed_source_row_is_named_and_nothing_is_written(ae: ArchiveEnv) -> None:
    job, sid, vol = _folder_job(ae, "repair-changed")
    assert _run(ae, job, sid, vol) == "succeeded"
    done = ae.job(job.namespace_id, job.id)
    d = FolderStorage(vol).job(done.namespace_id, done.id)
    before = _chain(d)
    name2 = before[2][0]
    d.remove([name2])
    first = json.loads(gzip_first_root(before[1][1]))
    with ae.engine.begin() as conn:  # a root of file 1 changed in the source since
        conn.execute(
            update(tasks)
            .where(tasks.c.id == bytes.fromhex(first["root"]["id"]))
            .values(error_code="CHANGED")
        )
    for extra in ((), ("--dry-run",)):
        out = _repair(ae, done, str(vol), *extra)
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert f"not_rebuilt: {name2} (missing)" in out.stdout
        assert "the source builds other bytes" in out.stdout
        assert name2 not in d.names() and len(d.names()) == len(before) - 1
    assert len(_audits(ae, done)) == 1  # the run that was not a dry run


def gzip_first_root(data: bytes) -> str:
    from orbit_tasks.archive.format.batch import decode_batch

    return json.dumps(decode_batch(data).lines[0])


def test_bad_input_is_one_line_and_writes_nothing(ae: ArchiveEnv) -> None:
    job, sid, vol = _folder_job(ae, "repair-bad")
    ns = job.namespace_id.hex()
    pending = _repair(ae, job, str(vol))
    assert_one_line_error(pending, 3, "repair is allowed from FAILED, SUCCEEDED or ABANDONED")
    assert_one_line_error(
        ae.orbit("job", "repair", ns, "00" * 16, "--volume", str(vol), check=False), 4, "job"
    )
    assert_one_line_error(
        ae.orbit("job", "repair", ns, "zz", "--volume", str(vol), check=False), 2, "job id"
    )
    other = ae.tmp / "not-a-volume"
    other.mkdir()
    assert _run(ae, job, sid, vol) == "succeeded"
    assert_one_line_error(_repair(ae, job, str(other)), 2, str(other))
    with ae.engine.begin() as conn:  # the job's policy revision is gone: no range to read
        conn.execute(text("DELETE FROM orbit_archive_policies WHERE namespace_id = :n"),
                     {"n": job.namespace_id})  # fmt: skip
    assert_one_line_error(_repair(ae, job, str(vol)), 1, "POLICY_MISSING", "nothing to rebuild")
    with ae.engine.connect() as conn:
        n = conn.execute(text("SELECT COUNT(*) FROM orbit_audit_events WHERE action = :a"),
                         {"a": "archive.job.repair"}).scalar()  # fmt: skip
    assert n == 0


def test_the_final_steps_progress_is_written_only_under_the_lease(ae: ArchiveEnv) -> None:
    """store.release_with_progress (issue 24 item 4) is one fenced transaction: a claim whose
    lease was taken writes neither the release nor the progress; the owner's progress is read
    back only for its own chain, and the success deletes it."""
    from orbit_tasks.archive.engine.verify import verify_job_part
    from orbit_tasks.archive.store import jobs as job_store
    from orbit_tasks.errors import LeaseLost

    job, sid, vol = _folder_job(ae, "repair-progress")
    assert _run(ae, job, sid, vol) == "succeeded"
    with ae.engine.begin() as conn:  # back to RUNNING-able for a hand-made claim
        conn.execute(text("UPDATE orbit_archive_jobs SET state = 'PENDING' WHERE id = :j"),
                     {"j": job.id})  # fmt: skip
    stale = job_store.claim(ae.engine, job.namespace_id, job.id, 60)
    assert stale is not None
    done = stale.job
    d = FolderStorage(vol).job(done.namespace_id, done.id)
    answers = iter([True, False])  # the manifest and batch 1, then the time is up
    _, progress = verify_job_part(
        d, expectation(ae, done), names=d.names(), progress=None, more=lambda: next(answers)
    )
    assert progress is not None and progress.checked == 2
    with ae.engine.begin() as conn:  # another claim took the job
        conn.execute(text("UPDATE orbit_archive_jobs SET lease_id = :l WHERE id = :j"),
                     {"l": b"\x07" * 16, "j": job.id})  # fmt: skip
    with pytest.raises(LeaseLost):
        job_store.release_with_progress(ae.engine, stale, progress)
    assert job_store.final_progress(ae.engine, done) is None
    with ae.engine.begin() as conn:
        conn.execute(text("UPDATE orbit_archive_jobs SET lease_id = :l WHERE id = :j"),
                     {"l": stale.lease_id, "j": job.id})  # fmt: skip
    job_store.release_with_progress(ae.engine, stale, progress)
    assert ae.job(job.namespace_id, job.id).state is JobState.PENDING
    assert job_store.final_progress(ae.engine, done) == progress
    other = replace(done, last_sha256="d" * 64)
    assert job_store.final_progress(ae.engine, other) is None  # another chain's: ignored
    assert _run(ae, job, sid, vol) == "succeeded"  # resumes (2 files vouched for), finishes
    assert job_store.final_progress(ae.engine, done) is None
