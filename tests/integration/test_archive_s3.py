"""Archives on S3-compatible object storage (issue 18), against a real S3 HTTP server on
loopback (moto's, tests/support/s3.py), real MariaDB, Redis and ``celery worker`` processes.

The CLI cycle (init, plan, tick, worker, SUCCEEDED, job verify, export, restore) on every kind,
a SIGKILL and a takeover, a stale writer, a fault proxy answering 503 / SlowDown / resets, the
permanent faults' fixed codes, a tampered object and the operator's bad input.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.archive.claims import GROUP_FILES
from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.engine.objects import S3Storage, checksum_matches
from orbit_tasks.archive.engine.volume import FileConflict
from orbit_tasks.archive.format.names import manifest_name, parse_name
from orbit_tasks.archive.format.values import sha256_hex
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.s3_locations import S3Location
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.archive_jobs import (
    ArchiveEnv,
    adoption_race,
    archive_env,
    assert_succeeded_exactly,
    cli_json,
    create_job,
    make_namespace,
    make_plan,
    seed,
    wait_for,
    wait_marker,
    wait_state,
)
from tests.support.cli import assert_one_line_error, orbit_env, run_orbit
from tests.support.db import mariadb_database, migrated_engine
from tests.support.restore import assert_target_holds, job_rows, odd_task, restore_job
from tests.support.s3 import REGION, MotoServer, bucket_name, free_port
from tests.support.s3 import moto_fixture as moto_fixture  # the session's S3 server
from tests.support.sender_proxy import PASS, Fault, fault_proxy

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]

DONE = {JobState.SUCCEEDED, JobState.FAILED}


def _init(ae: ArchiveEnv, moto: MotoServer, url: str, *extra: str) -> tuple[bytes, S3Location]:
    """``orbit storage init s3://...`` through the real script; the storage and its location."""
    doc = cli_json(ae.orbit(*moto.init_args(url), *extra, "--json"))
    assert doc["status"] == "created" and doc["path"] == url, doc
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    loc = S3Location(bucket, prefix, moto.endpoint, REGION, True)
    return bytes.fromhex(doc["id"]), loc


def _chain_keys(moto: MotoServer, loc: S3Location, job: Job) -> list[str]:
    return moto.keys(loc.bucket, loc.key(f"{job.namespace_id.hex()}/{job.id.hex()}/"))


def _assert_prefix_is_exactly_the_chains(
    moto: MotoServer, loc: S3Location, jobs: list[Job]
) -> None:
    """After SUCCEEDED the storage's prefix holds its identity and each job's chain, nothing
    else (no stray object)."""
    keys = moto.keys(loc.bucket, loc.prefix)
    expected = 1 + sum(j.batches + 1 for j in jobs)
    assert len(keys) == expected, keys
    assert loc.key(".orbit-volume.json") in keys


def _scene_behind(
    ae: ArchiveEnv, moto: MotoServer, proxy_url: str, url: str, name: str, kinds: list[str],
    batch_size: int, roots: int,
) -> bytes:  # fmt: skip
    """A storage at ``url`` registered behind a fault proxy, a namespace ``name`` with a plan
    and ``roots`` seeded roots of each kind; returns the namespace id."""
    doc = cli_json(ae.orbit(*moto.init_args(url, proxy_url), "--json"))
    sid = bytes.fromhex(doc["id"])
    ns, queue = make_namespace(ae.engine, name)
    for kind in kinds:
        make_plan(ae.engine, ns, kind, sid, batch_size=batch_size)
        seed(ae.engine, ns, queue, kind, roots)
    return ns


@pytest.fixture
def aws(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """The server's credentials in this process's AWS chain too (in-process runs)."""
    for k, v in moto.env().items():
        monkeypatch.setenv(k, v)
    return moto


@pytest.fixture
def s3ae(platform_engine: Engine, mariadb_url: str, tmp_path: Path, aws: MotoServer) -> Any:
    with archive_env(mariadb_url, platform_engine, tmp_path, **aws.env()) as ae:
        yield ae


def test_moto_honours_conditional_put_and_keeps_the_checksum(aws: MotoServer) -> None:
    moto = aws
    """The server the tests use: a second PutObject with If-None-Match: * is refused (412:
    our store reads the object back and finds the same bytes), and the SHA-256 checksum we
    send is stored with the object. (moto does not recompute it: see tests/support/s3.py.)"""
    bucket = moto.bucket(bucket_name("probe"))
    storage = S3Storage(S3Location(bucket, "p", moto.endpoint, REGION, True), retry_seconds=5)
    storage.create_identity(b"\x01" * 16, "probe")
    jf = storage.job(b"\x02" * 16, b"\x03" * 16)
    data = b"orbit"
    name = manifest_name(sha256_hex(data))
    first, second = jf.store(name, data), jf.store(name, data)
    assert first.created and not second.created
    head = moto.client().head_object(Bucket=bucket, Key=f"p/{'02' * 16}/{'03' * 16}/{name}",
                                     ChecksumMode="ENABLED")  # fmt: skip
    assert checksum_matches(head["ChecksumSHA256"], data)
    # a content-addressed key holding other bytes is a conflict, left untouched
    other = manifest_name(sha256_hex(b"other"))
    key = f"p/{'02' * 16}/{'03' * 16}/{other}"
    moto.client().put_object(Bucket=bucket, Key=key, Body=b"not the content")
    with pytest.raises(FileConflict):
        jf.store(other, b"other")
    got = moto.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert got == b"not the content"


@pytest.mark.slow
def test_full_cycle_through_the_cli_on_every_kind(
    s3ae: ArchiveEnv, moto: MotoServer, mariadb_url: str, tmp_path: Path
) -> None:
    """init (storage class, SSE-S3), plan, tick, a worker serving an S3 storage and a folder,
    SUCCEEDED on every kind (children, 4-byte UTF-8, exact decimals), job verify, export and
    restore with --volume s3://...; no credential in any log or table."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("cycle"))
    url = f"s3://{bucket}/archive/orbit"
    sid, loc = _init(ae, moto, url, "--label", "s3", "--storage-class", "STANDARD_IA",
                     "--sse", "AES256")  # fmt: skip
    folder = tmp_path / "vol"
    folder_id = cli_json(ae.orbit("storage", "init", str(folder), "--create", "--json"))["id"]
    options = ("--storage-class", "STANDARD_IA", "--sse", "AES256")  # the same ones (issue 27)
    again = ae.orbit(*moto.init_args(url), *options, "--json")  # idempotent, as a folder's
    assert cli_json(again)["status"] == "existing"
    ns, queue = make_namespace(ae.engine, "s3-cycle")
    kinds = list(HISTORY_KINDS)
    for i, kind in enumerate(kinds):
        target = bytes.fromhex(folder_id) if kind == "audit" else sid
        make_plan(ae.engine, ns, kind, target, batch_size=6)
        seed(ae.engine, ns, queue, kind, 24, seed=60 + i)
    odd = odd_task(ae.engine, ns, queue)
    w = ae.worker("s3", [url, folder])
    created = ae.tick().jobs_created
    assert len(created) == len(kinds)
    jobs: dict[str, Job] = {}
    for _, kind, job_hex in created:
        done = wait_state(ae, ae.job(ns, bytes.fromhex(job_hex)), DONE, timeout=120)
        assert done.state is JobState.SUCCEEDED, done
        assert done.attempts == done.batches + 1, done
        place = folder if kind == "audit" else S3Storage(loc)
        assert_succeeded_exactly(ae, done, place)
        jobs[kind] = done
    _assert_prefix_is_exactly_the_chains(moto, loc, [j for k, j in jobs.items() if k != "audit"])
    some_key = _chain_keys(moto, loc, jobs["tasks"])[1]
    head = moto.client().head_object(Bucket=bucket, Key=some_key)
    assert head["StorageClass"] == "STANDARD_IA" and head["ServerSideEncryption"] == "AES256"

    env = orbit_env(mariadb_url, **moto.env())
    for kind in ("tasks", "workflows", "deliveries"):
        job = jobs[kind]
        ok = run_orbit(["job", "verify", "s3-cycle", job.id.hex(), "--volume", url, "--json"], env)
        assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True, ok.stderr
        lines = run_orbit(["job", "export", "s3-cycle", job.id.hex(), "--volume", url], env)
        exported = [json.loads(ln) for ln in lines.stdout.splitlines()]
        assert len(exported) == job.roots and all("children" in o for o in exported)
        expected = job_rows(ae.engine, job)
        if kind == "tasks":
            assert odd in [r["id"] for r in expected["orbit_tasks"]]
        with mariadb_database("orbit_s3r") as empty:
            summary = restore_job(env, job, url, empty)
            assert summary["ok"] and summary["conflicts"] == []
            assert_target_holds(empty, expected)
        sqlite_url = f"sqlite:///{tmp_path / f'{kind}.sqlite3'}"
        restore_job(env, job, url, sqlite_url)
        assert_target_holds(sqlite_url, expected)
    window = run_orbit(
        ["archive", "restore", "s3-cycle", "tasks", "--volume", url, "--volume", str(folder),
         "--into", f"sqlite:///{tmp_path / 'window.sqlite3'}", "--json"], env,
    )  # fmt: skip
    assert window.returncode == 0, window.stderr

    secret = moto.secret_key
    assert secret not in w.text() and secret not in window.stdout + window.stderr
    with ae.engine.connect() as conn:
        for table in ("orbit_archive_storages", "orbit_archive_object_storages",
                      "orbit_archive_jobs", "orbit_audit_events"):  # fmt: skip
            rows = conn.execute(text(f"SELECT * FROM {table}")).all()
            assert secret not in repr(rows) and moto.access_key not in repr(rows), table


@pytest.mark.slow
def test_sigkill_mid_job_then_takeover_by_a_second_worker(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    ae = s3ae
    bucket = moto.bucket(bucket_name("kill"))
    url = f"s3://{bucket}/k"
    sid, loc = _init(ae, moto, url)
    ns, queue = make_namespace(ae.engine, "s3-kill")
    make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
    seed(ae.engine, ns, queue, "tasks", 60)
    marker = ae.tmp / "marker"
    victim = ae.worker("victim", [url], failpoints=f"archive.after_file_write=pause@3:{marker}")
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)  # the third file is durable, not confirmed
    victim.signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    at_kill = ae.job(ns, job.id)
    assert at_kill.state is JobState.RUNNING
    # + the unconfirmed group of batch 2 (group durability: up to GROUP_FILES objects)
    assert 2 <= len(_chain_keys(moto, loc, job)) - at_kill.batches <= 1 + GROUP_FILES
    ae.worker("rescuer", [url])
    done = wait_state(ae, job, DONE, timeout=90)
    assert done.state is JobState.SUCCEEDED, done
    assert done.attempts == done.batches + 2  # one dead claim
    assert_succeeded_exactly(ae, done, S3Storage(loc))  # no root lost or doubled
    _assert_prefix_is_exactly_the_chains(moto, loc, [done])  # no stray object


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@pytest.mark.slow
def test_stale_writer_past_its_lease_leaves_exactly_the_chain(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    ae = s3ae
    bucket = moto.bucket(bucket_name("stale"))
    url = f"s3://{bucket}/s"
    sid, loc = _init(ae, moto, url)
    ns, queue = make_namespace(ae.engine, "s3-stale")
    make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
    seed(ae.engine, ns, queue, "tasks", 60)
    marker = ae.tmp / "stopped"
    stale = ae.worker(
        "stale", [url], failpoints=f"archive.after_file_write=stop@3:{marker}", pool="solo"
    )
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)
    wait_for(lambda: _is_stopped(stale.proc.pid), 10, "SIGSTOP")
    at_stop = ae.job(ns, job.id)
    keys = _chain_keys(moto, loc, job)
    assert 2 <= len(keys) - at_stop.batches <= 1 + GROUP_FILES  # + its unconfirmed group
    ae.worker("owner", [url])
    done = wait_state(ae, job, DONE, timeout=90)  # the owner took over past the lease
    assert done.state is JobState.SUCCEEDED, done
    stale.signal(signal.SIGCONT)
    wait_for(lambda: "archive.job.lease_lost" in stale.text(), 30, "stale confirm rejected")
    assert_succeeded_exactly(ae, done, S3Storage(loc))
    _assert_prefix_is_exactly_the_chains(moto, loc, [done])
    # its object was the owner's to remove on the takeover, and the owner re-wrote that very
    # name (a content-addressed batch is the same whoever builds it): no stray, no loss
    assert "archive.job.cleanup_skipped" not in stale.text()


@pytest.mark.slow
def test_stale_writer_removes_its_own_object_once_the_job_moved_on(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    """SPEC §5 step 6 on S3: a writer stopped before its PUT past its lease; the job is
    abandoned meanwhile (nobody will confirm that position). Back, it puts the object, its
    confirm is rejected, and it deletes that object itself: the prefix holds the confirmed
    files only."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("stale2"))
    url = f"s3://{bucket}/s"
    sid, loc = _init(ae, moto, url)
    ns, queue = make_namespace(ae.engine, "s3-stale2")
    make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
    seed(ae.engine, ns, queue, "tasks", 60)
    marker = ae.tmp / "stopped"
    stale = ae.worker("stale", [url], failpoints=f"objects.before_put=stop@3:{marker}", pool="solo")
    job = create_job(ae, ns, "tasks")
    wait_marker(marker)
    wait_for(lambda: _is_stopped(stale.proc.pid), 10, "SIGSTOP")
    wait_for(
        lambda: ae.orbit("job", "abandon", "s3-stale2", job.id.hex(), check=False).returncode == 0,
        30,
        "the lease to expire and the abandon to pass",
        step=0.5,
    )
    abandoned = ae.job(ns, job.id)
    assert abandoned.state is JobState.ABANDONED
    stale.signal(signal.SIGCONT)
    wait_for(lambda: "archive.job.lease_lost" in stale.text(), 30, "stale confirm rejected")
    wait_for(lambda: len(_chain_keys(moto, loc, job)) == abandoned.batches + 1, 10, "its removal")
    names = [k.rsplit("/", 1)[1] for k in _chain_keys(moto, loc, job)]
    assert sorted(parse_name(n).seq for n in names) == list(range(abandoned.batches + 1))  # type: ignore[union-attr]
    assert "archive.job.cleanup_skipped" not in stale.text()


@pytest.mark.slow
def test_transient_faults_are_retried_and_the_job_verifies(
    s3ae: ArchiveEnv, moto: MotoServer, mariadb_url: str
) -> None:
    """A fault proxy between the worker and the server answers 503, SlowDown or resets the
    connection on a fraction of requests: retried inside the lease, no error code."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("faults"))
    url = f"s3://{bucket}/f"
    rnd = random.Random(18)
    slow = (
        b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
    )
    xml = (("Content-Type", "application/xml"),)

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        roll = rnd.random()
        if roll < 0.1:
            return Fault("status", 503, xml, body=b"<Error><Code>ServiceUnavailable</Code></Error>")
        if roll < 0.2:
            return Fault("status", 503, xml, body=slow)
        if roll < 0.3:
            return Fault("drop_before")
        return PASS

    with fault_proxy(moto.endpoint, rule) as proxy:
        ns = _scene_behind(ae, moto, proxy.url, url, "s3-faults", ["workflows"], 5, 60)
        w = ae.worker("faulty", [url])
        job = create_job(ae, ns, "workflows")
        done = wait_state(ae, job, DONE, timeout=120)
        assert done.state is JobState.SUCCEEDED and done.error_code == "", done
        faults = [s for s in proxy.seen if s.action != "pass"]
        assert len(faults) >= 3, proxy.seen
        assert "archive.storage.retry" in w.text()
    loc = S3Location(bucket, "f", moto.endpoint, REGION, True)
    assert_succeeded_exactly(ae, done, S3Storage(loc))
    _assert_prefix_is_exactly_the_chains(moto, loc, [done])


def test_an_object_stored_short_is_put_again_before_it_counts_as_written(
    aws: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The first PUT of a chain file reaches the server one byte short (a fault proxy; moto
    keeps what it got): the HEAD before the confirm finds the wrong size, our fresh unconfirmed
    object is deleted and put again, and the store returns only once the bytes are there
    (issue 24 item 2)."""
    moto = aws
    bucket = moto.bucket(bucket_name("short"))
    puts = [0]

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method == "PUT" and ".orbit-volume" not in path:
            puts[0] += 1
            if puts[0] == 1:
                return Fault("truncate", drop_headers=("x-amz-checksum-sha256",))
        return PASS

    with fault_proxy(moto.endpoint, rule) as proxy:
        storage = S3Storage(S3Location(bucket, "s", proxy.url, REGION, True), retry_seconds=5)
        storage.create_identity(b"\x01" * 16, "short")
        jf = storage.job(b"\x02" * 16, b"\x03" * 16)
        data = b"orbit archive bytes"
        name = manifest_name(sha256_hex(data))
        with caplog.at_level("WARNING", logger="orbit.archive.engine.objects"):
            stored = jf.store(name, data)
        seen = [(s.method, s.action) for s in proxy.seen if ".orbit-volume" not in s.path]
        assert jf.read(name) == data
    assert stored.created
    assert seen[:4] == [("PUT", "truncate"), ("HEAD", "pass"), ("DELETE", "pass"), ("PUT", "pass")]
    assert "archive.storage.put_lost" in caplog.text and '"found": "size"' in caplog.text


@pytest.mark.slow
def test_a_server_that_answers_200_without_storing_costs_a_retry_not_the_job(
    s3ae: ArchiveEnv, moto: MotoServer, mariadb_url: str
) -> None:
    """A fault proxy answers 200 to 5% of the chain PUTs (every 20th) without forwarding them:
    the worker finds the object missing before its fenced confirm and puts it again, so every
    job SUCCEEDED and verifies (before: the final step found the lost file, FAILED
    CHAIN_BROKEN, and no retry could repair it; issue 24 item 2)."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("lossy"))
    url = f"s3://{bucket}/z"
    puts = [0]

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        if method != "PUT" or ".orbit-volume.json" in path:
            return PASS
        puts[0] += 1
        if puts[0] % 20 == 7:  # 200, an ETag and no body: nothing stored
            return Fault("status", 200, (("ETag", '"0123456789abcdef0123456789abcdef"'),), body=b"")
        return PASS

    with fault_proxy(moto.endpoint, rule) as proxy:
        kinds = ["workflows", "tasks"]
        ns = _scene_behind(ae, moto, proxy.url, url, "s3-lossy", kinds, 3, 60)
        w = ae.worker("lossy", [url])
        report = ae.tick()
        jobs = [ae.job(ns, bytes.fromhex(j)) for n, _k, j in report.jobs_created if n == ns.hex()]
        assert len(jobs) == len(kinds), report.to_dict()
        done = [wait_state(ae, job, DONE, timeout=180) for job in jobs]
        lost = [s for s in proxy.seen if s.action == "status"]
    assert len(lost) >= 2, proxy.seen
    assert all(d.state is JobState.SUCCEEDED and d.error_code == "" for d in done), done
    assert w.text().count("archive.storage.put_lost") >= len(lost)
    loc = S3Location(bucket, "z", moto.endpoint, REGION, True)
    for d in done:
        assert_succeeded_exactly(ae, d, S3Storage(loc))
    _assert_prefix_is_exactly_the_chains(moto, loc, done)


@pytest.mark.slow
def test_a_final_step_longer_than_a_delivery_resumes_across_claims(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    """Every GET of a chain object is 60 ms slow (a fault proxy); over 100 files under the
    tests' lease (6 s: soft time limit 4 s, longest slice 3 s) need 6-10 s of GETs in the final
    step. A real worker verifies a part per delivery, records its progress and releases; the
    continuations finish the walk: SUCCEEDED, never a time limit (before: the soft limit hit a
    GET inside the S3 retry loop and the job FAILED IO_ERROR; issue 24 item 4)."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("final"))
    url = f"s3://{bucket}/v"

    def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
        chain_get = method == "GET" and "list-type" not in path and ".orbit-volume" not in path
        return Fault("sleep", seconds=0.06) if chain_get and path.count("/") > 3 else PASS

    with fault_proxy(moto.endpoint, rule) as proxy:
        ns = _scene_behind(ae, moto, proxy.url, url, "s3-final", ["events"], 1, 160)
        w = ae.worker("final", [url])
        job = create_job(ae, ns, "events")
        done = wait_state(ae, job, DONE, timeout=240)
        slow = [s for s in proxy.seen if s.action == "sleep"]
    assert done.state is JobState.SUCCEEDED and done.error_code == "", done
    assert done.batches >= 100 and len(slow) > done.batches + 1, (done.batches, len(slow))
    log = w.text()
    assert log.count("archive.job.final_step_released") >= 2, log[-3000:]
    assert "archive.job.time_limit" not in log and "archive.job.takeover" not in log
    loc = S3Location(bucket, "v", moto.endpoint, REGION, True)
    assert_succeeded_exactly(ae, done, S3Storage(loc))
    with ae.engine.connect() as conn:  # the progress goes with the success
        assert conn.execute(text("SELECT COUNT(*) FROM orbit_archive_job_checks")).scalar() == 0


def test_access_denied_and_no_such_bucket_are_fixed_codes(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    ae = s3ae
    denied = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
    xml = (("Content-Type", "application/xml"),)
    for case in ("denied", "nobucket"):
        bucket = moto.bucket(bucket_name(case))
        url = f"s3://{bucket}/x"
        sid, loc = _init(ae, moto, url)
        ns, queue = make_namespace(ae.engine, f"s3-{case}")
        make_plan(ae.engine, ns, "events", sid, batch_size=5)
        seed(ae.engine, ns, queue, "events", 10)
        job = create_job(ae, ns, "events")

        def rule(method: str, path: str, key: str | None, attempt: int) -> Fault:
            return Fault("status", 403, xml, body=denied) if method == "PUT" else PASS

        with fault_proxy(moto.endpoint, rule) as proxy:
            if case == "nobucket":
                client = moto.client()
                for k in moto.keys(bucket):
                    client.delete_object(Bucket=bucket, Key=k)
                client.delete_bucket(Bucket=bucket)
                place = loc
            else:
                place = S3Location(bucket, "x", proxy.url, REGION, True)
            out = runner.run_job(
                ns.hex(), job.id.hex(), {sid.hex(): place}, ae.settings, engine=ae.engine,
                publish=lambda *a, **k: None,
            )  # fmt: skip
        assert out == "failed"
        failed = ae.job(ns, job.id)
        assert failed.error_code == ("ACCESS_DENIED" if case == "denied" else "NO_SUCH_BUCKET")


def test_tampered_object_is_named_by_verify_and_restore_writes_nothing(
    s3ae: ArchiveEnv, moto: MotoServer, mariadb_url: str, tmp_path: Path
) -> None:
    ae = s3ae
    bucket = moto.bucket(bucket_name("tamper"))
    url = f"s3://{bucket}/t"
    sid, loc = _init(ae, moto, url)
    ns, queue = make_namespace(ae.engine, "s3-tamper")
    make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
    seed(ae.engine, ns, queue, "tasks", 30)
    job = create_job(ae, ns, "tasks")
    out = None
    while out in (None, "released"):
        out = runner.run_job(ns.hex(), job.id.hex(), {sid.hex(): loc}, ae.settings,
                             engine=ae.engine, publish=lambda *a, **k: None)  # fmt: skip
    done = ae.job(ns, job.id)
    assert out == "succeeded" and done.batches >= 3
    keys = _chain_keys(moto, loc, done)
    middle = keys[len(keys) // 2]
    client = moto.client()
    body = bytearray(client.get_object(Bucket=bucket, Key=middle)["Body"].read())
    body[len(body) // 2] ^= 0x01
    client.put_object(Bucket=bucket, Key=middle, Body=bytes(body))
    env = orbit_env(mariadb_url, **moto.env())
    bad = run_orbit(["job", "verify", "s3-tamper", done.id.hex(), "--volume", url, "--json"], env)
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["first_bad_file"] == middle.rsplit("/", 1)[1]
    target = tmp_path / "t.sqlite3"
    proc = run_orbit(["job", "restore", "s3-tamper", done.id.hex(), "--volume", url,
                      "--into", f"sqlite:///{target}"], env)  # fmt: skip
    assert proc.returncode != 0 and middle.rsplit("/", 1)[1] in proc.stderr
    assert not target.exists() or target.stat().st_size == 0


def test_bad_input_is_one_line_and_writes_nothing(
    s3ae: ArchiveEnv, moto: MotoServer, mariadb_url: str
) -> None:
    ae = s3ae
    env = dict(ae.env)
    bucket = moto.bucket(bucket_name("bad"))

    def init(url: str, *extra: str, environ: dict[str, str] | None = None) -> Any:
        return run_orbit([*moto.init_args(url), *extra], environ or env)

    assert_one_line_error(init("s3://"), 2, "names no bucket")
    assert_one_line_error(init("s3:///prefix"), 2, "names no bucket")
    assert_one_line_error(init("s3://Bad_Bucket/p"), 2, "not a valid S3 bucket name")
    assert_one_line_error(init(f"s3://{bucket}/p", "--sse", "rot13"), 2, "SSE mode")
    assert_one_line_error(run_orbit(["storage", "init", "/tmp/x", "--path-style"], env), 2,
                          "--path-style only apply")  # fmt: skip
    assert_one_line_error(init("s3://orbit-no-such-bucket-x/p"), 4, "does not exist")
    no_creds = {
        k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    assert_one_line_error(init(f"s3://{bucket}/p", environ=no_creds), 1, "no AWS credentials")
    wrong = run_orbit([*moto.init_args(f"s3://{bucket}/p", f"http://127.0.0.1:{free_port()}")], env)
    assert_one_line_error(wrong, 1, "did not answer")
    assert moto.keys(bucket) == []  # nothing written by any of them
    unknown = f"s3://{bucket}/not-registered"
    worker = run_orbit(["worker", "archive", "--volume", unknown, "--print-command"], env)
    assert_one_line_error(worker, 4, "not a storage registered in this platform database")
    with ae.engine.connect() as conn:
        assert (
            conn.execute(text("SELECT COUNT(*) FROM orbit_archive_object_storages")).scalar() == 0
        )
    # a storage of this database, then a second init of it from another platform database
    sid, _ = _init(ae, moto, f"s3://{bucket}/p")
    listed = json.loads(run_orbit(["storage", "list", "--json"], env).stdout)["items"]
    assert [s["location"] for s in listed if s["id"] == sid.hex()] == [
        f"s3://{bucket}/p at {moto.endpoint}"
    ]
    with (
        mariadb_database("orbit_s3other") as other_url,
        migrated_engine(other_url, "platform") as other,
    ):
        other_env = orbit_env(other_url, **moto.env())
        refused = run_orbit(moto.init_args(f"s3://{bucket}/p"), other_env)
        assert_one_line_error(refused, 3, sid.hex(), "not registered in this platform database")
        with other.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM orbit_archive_storages")).scalar() == 0
            assert (
                conn.execute(text("SELECT COUNT(*) FROM orbit_archive_object_storages")).scalar()
                == 0
            )
        nested = run_orbit(moto.init_args(f"s3://{bucket}/p/inner"), other_env)
        assert_one_line_error(nested, 3, "storages cannot nest")
    assert moto.keys(bucket) == ["p/.orbit-volume.json"]


def test_stale_writer_never_deletes_an_object_a_new_claim_adopted(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    """SPEC §5 step 6 on S3, the put-back race (tests/support/archive_jobs.py
    ``adoption_race``): the stale writer's object is ahead of a PENDING job; a new claim finds
    it under its own name (412, identical bytes) and confirms it. A delete re-checked
    afterwards (to put the bytes back) leaves the confirmed name missing while the stale
    writer is paused (SIGSTOP) -- the next claim fails CHAIN_BROKEN -- or for good if it dies."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("adopt"))
    sid, loc = _init(ae, moto, f"s3://{bucket}/a")
    ns, queue = make_namespace(ae.engine, "s3-adopt")
    make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
    seed(ae.engine, ns, queue, "tasks", 10)
    job = create_job(ae, ns, "tasks")
    storage = S3Storage(loc, retry_seconds=5)
    outcome, removed = adoption_race(ae, job, storage, loc)
    done = ae.job(ns, job.id)
    assert outcome == "succeeded" and done.state is JobState.SUCCEEDED, (outcome, done)
    assert removed == 0
    assert_succeeded_exactly(ae, done, storage)
    _assert_prefix_is_exactly_the_chains(moto, loc, [done])


def test_credentials_in_an_endpoint_or_url_are_refused_and_never_echoed(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    """An endpoint with user info (``http://KEY:SECRET@host``) or a query, or an s3:// URL with
    user info, is refused (exit 2, one line) without printing the secret, and nothing is
    written: credentials come only from the AWS chain, never from the registry."""
    ae = s3ae
    env = dict(ae.env)
    bucket = moto.bucket(bucket_name("creds"))
    secret = "s3cr3tPassw0rd"
    host = moto.endpoint.removeprefix("http://")
    for endpoint in (
        f"http://AKIAORBIT:{secret}@{host}",
        f"http://{secret}@{host}",
        f"http://{host}/?X-Amz-Signature={secret}",
        f"http://{host}?token={secret}",
        f"http://AKIAORBIT:{secret}@{host}/path",
    ):
        proc = run_orbit(moto.init_args(f"s3://{bucket}/p", endpoint), env)
        line = assert_one_line_error(proc, 2, "endpoint")
        assert secret not in line, line
    proc = run_orbit(moto.init_args(f"s3://AKIAORBIT:{secret}@{bucket}/p"), env)
    line = assert_one_line_error(proc, 2)
    assert secret not in line, line
    assert moto.keys(bucket) == []
    with ae.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM orbit_archive_storages")).scalar() == 0


@pytest.mark.slow
def test_a_job_prefix_over_a_thousand_keys_is_listed_whole(aws: MotoServer) -> None:
    """ListObjectsV2 answers at most 1,000 keys a page: a takeover's or a final step's listing
    follows the continuation tokens (every key of the job, none of the storage next door whose
    prefix starts with this one's: ``a/b`` and ``a/bc``)."""
    moto = aws
    bucket = moto.bucket(bucket_name("pages"))
    ns, job = b"\x02" * 16, b"\x03" * 16
    jf = S3Storage(S3Location(bucket, "a/b", moto.endpoint, REGION, True), retry_seconds=5).job(
        ns, job
    )
    client = moto.client()
    names = [f"{seq:08d}-{sha256_hex(str(seq).encode())}.jsonl.gz" for seq in range(1, 1004)]
    for n in names:
        client.put_object(Bucket=bucket, Key=f"a/b/{ns.hex()}/{job.hex()}/{n}", Body=b"x")
    client.put_object(Bucket=bucket, Key=f"a/bc/{ns.hex()}/{job.hex()}/{names[0]}", Body=b"y")
    assert jf.names() == sorted(names)
    assert jf.exists()
    jf.remove(names[1000:])
    assert jf.names() == sorted(names[:1000])
    assert moto.keys(bucket, "a/bc/") == [f"a/bc/{ns.hex()}/{job.hex()}/{names[0]}"]


def test_debug_logging_prints_no_credential(s3ae: ArchiveEnv, moto: MotoServer) -> None:
    """``ORBIT_LOG_LEVEL=DEBUG`` must not turn botocore's request dumps on: they carry the
    access key id (``Authorization``), the signature and a session token
    (``x-amz-security-token``) of the AWS chain."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("debug"))
    token = "orbitSessionToken" + bucket[-8:]
    env = {**ae.env, "ORBIT_LOG_LEVEL": "DEBUG", "AWS_SESSION_TOKEN": token}
    proc = run_orbit([*moto.init_args(f"s3://{bucket}/d"), "--json"], env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "DEBUG" in out  # the level took effect
    for secret in (token, moto.access_key, moto.secret_key, "Signature="):
        assert secret not in out, secret


def test_no_listing_per_batch(s3ae: ArchiveEnv, moto: MotoServer) -> None:
    """A job of many files, claims from PENDING only (released at every slice): the prefix is
    listed once, at the final step; per file one conditional PUT and one identity GET."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("lists"))
    sid, _ = _init(ae, moto, f"s3://{bucket}/l")
    ns, queue = make_namespace(ae.engine, "s3-lists")
    make_plan(ae.engine, ns, "tasks", sid, batch_size=3)
    seed(ae.engine, ns, queue, "tasks", 30)
    job = create_job(ae, ns, "tasks")
    with fault_proxy(moto.endpoint, lambda *a: PASS) as proxy:
        place = S3Location(bucket, "l", proxy.url, REGION, True)
        settings = ae.settings.with_overrides(archive_slice_seconds=0)
        outcomes = []
        while not outcomes or outcomes[-1] == "released":
            outcomes.append(
                runner.run_job(
                    ns.hex(),
                    job.id.hex(),
                    {sid.hex(): place},
                    settings,
                    engine=ae.engine,
                    publish=lambda *a, **k: None,
                )  # fmt: skip
            )
        seen = list(proxy.seen)
    done = ae.job(ns, job.id)
    assert outcomes[-1] == "succeeded" and done.batches >= 8, (outcomes, done)
    # one released delivery per group of files (the slice is 0: nothing is written ahead)
    assert len(outcomes) >= -(-done.batches // GROUP_FILES)
    lists = [s for s in seen if s.method == "GET" and "list-type=2" in s.path]
    puts = [s for s in seen if s.method == "PUT"]
    assert len(lists) == 1, [s.path for s in lists]
    assert len(puts) == done.batches + 1


def test_a_slow_identity_read_does_not_cost_the_command_its_session(
    s3ae: ArchiveEnv, moto: MotoServer
) -> None:
    """Before: ``--volume s3://...`` read the identity object while the command's registry read
    kept its transaction open; an S3 answer slower than the server's idle-transaction bound (a
    quarter of the lease) closed the session, and the command's next query failed "database
    unavailable (2006)" (worker start-up under load). The registry read now ends first."""
    ae = s3ae
    bucket = moto.bucket(bucket_name("slow"))
    sid, _ = _init(ae, moto, f"s3://{bucket}/p")
    env = {
        **ae.env,
        "ORBIT_ARCHIVE_LEASE_SECONDS": "4",
        "ORBIT_ARCHIVE_SLICE_SECONDS": "1",
        "ORBIT_FAILPOINTS": "objects.identity=sleep:2.5",
    }
    worker = run_orbit(
        ["worker", "archive", "--volume", f"s3://{bucket}/p", "--print-command"], env
    )
    assert worker.returncode == 0, worker.stderr
    assert f"orbit.archive.{sid.hex()}" in worker.stdout
