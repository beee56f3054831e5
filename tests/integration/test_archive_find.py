"""``orbit archive find`` and ``orbit archive index`` (issue 28 item 1): an archived root by its
id, exactly as archived, with its proof, in three file reads. Real MariaDB and SQLite, folders
and moto's S3 server, the real ``orbit`` script, a real ``orbit worker archive`` building the
index when the tick wakes it; the jobs run in-process (the runner itself) or in that worker.

Ids from the first, a middle and the last file, with random (not time-ordered) ids; after the
source rows were deleted; an id never archived (exit 4); jobs not indexed yet (exit 3); a
tampered batch file, top or shard: refused, the file named (exit 1); bad input: one line, exit
2, nothing written.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, select

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.engine.storage import FolderStorage, JobFiles, Place, open_storage
from orbit_tasks.archive.format.gzip_member import gunzip_member
from orbit_tasks.archive.format.names import parse_name
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.s3_locations import S3Location
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.archive.wakeups import make_index_publisher
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.history_tables import task_attempts, tasks
from orbit_tasks.db.platform_tables import job_indexes
from orbit_tasks.dev import generator
from orbit_tasks.ids import random_id
from tests.support.archive_jobs import (
    ArchiveEnv,
    archive_env,
    create_job,
    make_due,
    make_namespace,
    make_plan,
    make_volume,
    wait_for,
    wait_state,
)
from tests.support.cli import assert_one_line_error
from tests.support.s3 import REGION, MotoServer, bucket_name
from tests.support.s3 import moto_fixture as moto_fixture  # the session's S3 server

pytestmark = [pytest.mark.redis]


@pytest.fixture
def fae(any_platform_url: str, any_platform_engine: Engine, tmp_path: Path) -> Iterator[ArchiveEnv]:
    """An archive environment on SQLite and on MariaDB."""
    with archive_env(any_platform_url, any_platform_engine, tmp_path) as env:
        yield env


@pytest.fixture
def s3ae(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, moto: MotoServer,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ArchiveEnv]:  # fmt: skip
    for k, v in moto.env().items():
        monkeypatch.setenv(k, v)
    with archive_env(mariadb_url, platform_engine, tmp_path, **moto.env()) as env:
        yield env


def _seed_random(engine: Engine, ns: bytes, queue: bytes, roots: int, seed: int = 7) -> None:
    """``orbit dev seed-history --random-ids``: ids that are not time-ordered."""
    spec = generator.make_spec("tasks", roots, days=2, random_ids=True)
    with engine.begin() as conn:
        generator.seed_history(conn, spec, ns, [queue], random.Random(seed), db_now(conn))


def _run(ae: ArchiveEnv, job: Job, sid: bytes, place: Place) -> Job:
    out = None
    while out in (None, "released"):
        out = runner.run_job(
            job.namespace_id.hex(), job.id.hex(), {sid.hex(): place}, ae.settings,
            engine=ae.engine, publish=lambda *a, **k: None,
        )  # fmt: skip
    done = ae.job(job.namespace_id, job.id)
    assert done.state is JobState.SUCCEEDED, (out, done)
    return done


def _job(ae: ArchiveEnv, name: str, sid: bytes, place: Place, roots: int = 30) -> Job:
    ns, queue = make_namespace(ae.engine, name)
    make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
    _seed_random(ae.engine, ns, queue, roots)
    return _run(ae, create_job(ae, ns, "tasks"), sid, place)


def _lines(d: JobFiles) -> dict[int, tuple[str, list[bytes]]]:
    """seq -> (batch name, its root lines exactly as stored)."""
    out = {}
    for n in d.names():
        p = parse_name(n)
        if p is not None and not p.is_manifest:
            out[p.seq] = (n, gunzip_member(d.read(n)).split(b"\n")[1:-1])
    return out


def _find(ae: ArchiveEnv, job: Job, rid: str, where: str, *extra: str) -> Any:
    return ae.orbit("archive", "find", job.namespace_id.hex(), "tasks", rid, "--volume", where,
                    *extra, check=False)  # fmt: skip


def _index_rows(ae: ArchiveEnv) -> int:
    with ae.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(job_indexes)).scalar_one())


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _find_cycle(
    ae: ArchiveEnv, job: Job, storage: Any, where: str
) -> dict[int, tuple[str, list[bytes]]]:
    """Not indexed yet -> exit 3; indexed by the CLI; ids of the first, a middle and the last
    file found with their exact line and a three-read proof; a never archived id -> exit 4."""
    d = storage.job(job.namespace_id, job.id)
    chain = _lines(d)
    assert len(chain) == job.batches >= 6
    first_id = json.loads(chain[1][1][0])["root"]["id"]
    refused = _find(ae, job, first_id, where)
    assert_one_line_error(refused, 3, "no index yet", "orbit archive index ")

    built = ae.orbit("archive", "index", job.namespace_id.hex(), "--volume", where, "--json")
    (one,) = json.loads(built.stdout)["jobs"]
    assert one["built"] and one["roots"] == job.roots
    again = ae.orbit("archive", "index", job.namespace_id.hex(), job.id.hex(), "--volume", where)
    assert again.stdout.startswith("already indexed: job ")
    assert d.names() and len(d.names()) == job.batches + 1  # the job directory: its chain only

    middle = job.batches // 2
    for seq, pick in ((1, 0), (middle, 1), (job.batches, -1)):
        name, lines = chain[seq]
        line = lines[pick]
        rid = json.loads(line)["root"]["id"]
        out = _find(ae, job, rid, where, "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["job"]["id"] == job.id.hex() and doc["file"]["name"] == name
        assert doc["file"]["seq"] == seq and doc["line"].encode() == line  # exactly as archived
        assert doc["files_read"] == 3, doc["files_read_names"]
        assert doc["proof"]["file_sha256"] == parse_name(name).sha256  # type: ignore[union-attr]
        prev = chain[seq - 1][0] if seq > 1 else next(n for n in d.names() if n.endswith(".json"))
        assert doc["proof"]["prev_file"] == prev
        assert doc["proof"]["last_sha256"] == job.last_sha256

    text = _find(ae, job, rid, where)  # the last one, for people
    assert text.returncode == 0 and line.decode() in text.stdout, text.stdout
    assert "files read  3" in text.stdout and f"= {prev}" in text.stdout

    missing = random_id().hex()
    assert_one_line_error(_find(ae, job, missing, where), 4, missing, "is not archived")
    return chain


def test_find_on_a_folder(fae: ArchiveEnv) -> None:
    ae = fae
    vol = ae.tmp / "vol"
    sid = make_volume(ae.engine, vol)
    job = _job(ae, "find-folder", sid, vol)
    storage = FolderStorage(vol)
    chain = _find_cycle(ae, job, storage, str(vol))

    # the source rows are gone: the answer comes from the archive and the platform tables
    name, lines = chain[2]
    root = json.loads(lines[0])["root"]
    with ae.engine.begin() as conn:
        conn.execute(delete(task_attempts).where(task_attempts.c.namespace_id == job.namespace_id))
        assert conn.execute(delete(tasks).where(tasks.c.namespace_id == job.namespace_id)).rowcount
    gone = _find(ae, job, root["id"], str(vol), "--json")
    assert gone.returncode == 0 and json.loads(gone.stdout)["line"].encode() == lines[0]

    # bad input: one line, exit 2, nothing written
    before, rows = _tree(vol), _index_rows(ae)
    ns = job.namespace_id.hex()
    for args, needle in (
        (["no-such-ns", "tasks", root["id"]], "no-such-ns"),
        ([ns, "tasksx", root["id"]], "tasksx"),
        ([ns, "tasks", "xyz"], "'xyz'"),
        ([ns, "tasks", root["id"][:-1]], "32 hexadecimal"),
    ):
        out = ae.orbit("archive", "find", *args, "--volume", str(vol), check=False)
        assert_one_line_error(out, 2, needle)
    bad_index = ae.orbit("archive", "index", "no-such-ns", "--volume", str(vol), check=False)
    assert_one_line_error(bad_index, 2, "no-such-ns")
    assert _tree(vol) == before and _index_rows(ae) == rows

    # a tampered batch file: refused, the file named
    path = vol / ns / job.id.hex() / name
    good = path.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    path.write_bytes(bytes(bad))
    assert_one_line_error(_find(ae, job, root["id"], str(vol)), 1, name, "refusing to answer")
    path.write_bytes(good)

    # a tampered index (the top, then a shard): refused, the index file named
    index_dir = vol / ns / f"{job.id.hex()}.index"
    for pattern in ("index-*.json", f"shard-{root['id'][:2]}-*.bin"):
        (target,) = index_dir.glob(pattern)
        good = target.read_bytes()
        target.write_bytes(good[:-1] + bytes([good[-1] ^ 0x01]))
        assert_one_line_error(_find(ae, job, root["id"], str(vol)), 1, target.name)
        target.write_bytes(good)
    assert _find(ae, job, root["id"], str(vol)).returncode == 0


@pytest.mark.mariadb
def test_find_on_s3(s3ae: ArchiveEnv, moto: MotoServer) -> None:
    ae = s3ae
    bucket = moto.bucket(bucket_name("find"))
    url = f"s3://{bucket}/f"
    sid = bytes.fromhex(json.loads(ae.orbit(*moto.init_args(url), "--json").stdout)["id"])
    place = S3Location(bucket, "f", moto.endpoint, REGION, True)
    job = _job(ae, "find-s3", sid, place)
    storage = open_storage(place)
    chain = _find_cycle(ae, job, storage, url)
    keys = moto.keys(bucket, f"f/{job.namespace_id.hex()}/{job.id.hex()}.index/")
    assert any(k.rsplit("/", 1)[1].startswith("index-") for k in keys), keys

    name, lines = chain[job.batches]
    rid = json.loads(lines[-1])["root"]["id"]
    d = storage.job(job.namespace_id, job.id)
    good = d.read(name)
    d.remove([name])
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    client = d._client.get()  # type: ignore[attr-defined]
    client.put_object(Bucket=bucket, Key=d.prefix + name, Body=bytes(bad))  # type: ignore[attr-defined]
    assert_one_line_error(_find(ae, job, rid, url), 1, name, "refusing to answer")


@pytest.mark.mariadb
def test_the_tick_wakes_a_worker_that_builds_the_index(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Two SUCCEEDED jobs archived by a real worker; the tick wakes the index builds on the
    storage's queue; the worker builds both; an id of the older job is found in 4 or 5 reads
    (the newer job's top, its shard if it has one for the id's first byte, then the older
    job's three files)."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        vol = ae.tmp / "vol"
        sid = make_volume(ae.engine, vol)
        ns, queue = make_namespace(ae.engine, "find-tick")
        make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
        _seed_random(ae.engine, ns, queue, 20)
        ae.worker("w1", [vol])
        first = wait_state(ae, create_job(ae, ns, "tasks"), {JobState.SUCCEEDED})
        make_due(ae.engine, ns, "tasks")  # the next job: the last hour, maybe empty (indexed too)
        second = wait_state(ae, create_job(ae, ns, "tasks"), {JobState.SUCCEEDED})
        assert first.id != second.id and first.roots > 0

        report = run_tick(ae.engine, ae.settings, publish=ae.publish,
                          publish_index=make_index_publisher(ae.app))  # fmt: skip
        assert report.index_wakeups_published == 2
        wait_for(lambda: _index_rows(ae) == 2, 60, "both indexes recorded")
        later = run_tick(ae.engine, ae.settings, publish=ae.publish,
                         publish_index=make_index_publisher(ae.app))  # fmt: skip
        assert later.index_wakeups_published == 0
        assert (vol / ns.hex() / f"{first.id.hex()}.index").is_dir()

        chain = _lines(FolderStorage(vol).job(ns, first.id))
        rid = json.loads(chain[1][1][0])["root"]["id"]
        out = ae.orbit("archive", "find", ns.hex(), "tasks", rid, "--volume", str(vol), "--json")
        doc = json.loads(out.stdout)
        assert doc["job"]["id"] == first.id.hex() and 4 <= doc["files_read"] <= 5, doc


def test_find_without_an_id_and_unknown_storage(fae: ArchiveEnv) -> None:
    """A chain that does not verify is not indexed (exit 1 naming the file); no ID (the window
    listing is another option set): exit 2; a job on a storage no --volume gives: exit 2
    naming the storage; nothing written."""
    ae = fae
    vol, other = ae.tmp / "vol", ae.tmp / "other"
    sid = make_volume(ae.engine, vol)
    make_volume(ae.engine, other)
    job = _job(ae, "find-args", sid, vol, roots=8)
    # a chain that does not verify is not indexed: the file named, nothing recorded
    (path,) = (vol / job.namespace_id.hex() / job.id.hex()).glob("00000001-*")
    good = path.read_bytes()
    path.write_bytes(good[:20] + bytes([good[20] ^ 1]) + good[21:])
    refused = ae.orbit("archive", "index", job.namespace_id.hex(), "--volume", str(vol),
                       check=False)  # fmt: skip
    assert_one_line_error(refused, 1, path.name)
    assert _index_rows(ae) == 0
    assert not (vol / job.namespace_id.hex() / f"{job.id.hex()}.index").exists()
    path.write_bytes(good)
    ae.orbit("archive", "index", job.namespace_id.hex(), "--volume", str(vol))
    # an index file lost: find names it; `archive index` writes it again, the same bytes
    (top,) = (vol / job.namespace_id.hex() / f"{job.id.hex()}.index").glob("index-*.json")
    kept = top.read_bytes()
    top.unlink()
    rid = json.loads(_lines(FolderStorage(vol).job(job.namespace_id, job.id))[1][1][0])["root"][
        "id"
    ]
    assert_one_line_error(_find(ae, job, rid, str(vol)), 1, top.name, "missing")
    again = ae.orbit("archive", "index", job.namespace_id.hex(), job.id.hex(), "--volume", str(vol))
    assert again.stdout.startswith("indexed: job") and top.read_bytes() == kept
    assert _find(ae, job, rid, str(vol)).returncode == 0
    out = ae.orbit("archive", "find", job.namespace_id.hex(), "tasks", check=False)
    assert_one_line_error(out, 2, "ID")
    wrong = _find(ae, job, random_id().hex(), str(other))
    assert_one_line_error(wrong, 2, sid.hex(), "--volume")
