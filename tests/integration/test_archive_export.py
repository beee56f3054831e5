"""``orbit archive export`` and ``orbit archive roots`` (issue 28 items 4 and 1): a settled window
across SUCCEEDED jobs on folders and S3 (moto's server), platform on MariaDB and on SQLite, the
real CLI; the Parquet file read back by DuckDB and compared with the source rows; a tampered
file; bad input."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from sqlalchemy import Engine, insert, select

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.engine.storage import FolderStorage
from orbit_tasks.archive.engine.volume import job_dir
from orbit_tasks.archive.jobs import Job
from orbit_tasks.archive.restore import parquet
from orbit_tasks.archive.restore.export import ExportFormat, export_window
from orbit_tasks.archive.restore.run import Window
from orbit_tasks.archive.s3_locations import S3Location
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.history_tables import task_attempts, tasks
from orbit_tasks.dev import generator
from orbit_tasks.ids import new_id
from orbit_tasks.settings import Settings, load_settings
from tests.support.archive_jobs import (
    archive_env,
    cli_json,
    make_due,
    make_namespace,
    make_plan,
    make_volume,
)
from tests.support.cli import assert_one_line_error, orbit_env, run_orbit
from tests.support.db import migrated_engine
from tests.support.restore import ODD_JSON
from tests.support.s3 import REGION, MotoServer, bucket_name
from tests.support.s3 import moto_fixture as moto_fixture  # the session's S3 server

DAY = 86400


def _settled_history(engine: Engine, ns: bytes, queue: bytes, roots: int, days: int) -> None:
    """``roots`` settled tasks (two attempts each) over the last ``days`` days."""
    spec = generator.make_spec("tasks", roots, 2, days=days, settled_fraction=1.0)
    with engine.begin() as conn:
        generator.seed_history(conn, spec, ns, [queue], random.Random(roots), db_now(conn))


def _odd_root(engine: Engine, ns: bytes, queue: bytes, settled: datetime) -> bytes:
    """A root with NULLs where they are allowed, exact decimals no float holds (in JSON text),
    4-byte UTF-8, microsecond 1, no children."""
    rid = new_id()
    with engine.begin() as conn:
        conn.execute(
            insert(tasks).values(
                namespace_id=ns, id=rid, queue_id=queue, state="DONE😀", idempotency_key=None,
                request_json=ODD_JSON, result_json=None, error_code="E ", attempts=0,
                created_at=settled - timedelta(hours=1), started_at=None,
                finished_at=settled.replace(microsecond=1),
            )
        )  # fmt: skip
    return rid


def _archive(engine: Engine, settings: Settings, ns: bytes, places: dict[str, Any]) -> Job:
    """One tick (no wake-up) and the in-process runner until the job SUCCEEDED."""
    report = run_tick(engine, settings, publish=lambda *a, **k: None)
    job_hex = next(j for n, k, j in report.jobs_created if n == ns.hex() and k == "tasks")
    out = None
    while out in (None, "released"):
        out = runner.run_job(ns.hex(), job_hex, places, settings, engine=engine,
                             publish=lambda *a, **k: None)  # fmt: skip
    assert out == "succeeded", out
    with engine.connect() as conn:
        return job_store.require_job(conn, ns, bytes.fromhex(job_hex))


def _source(engine: Engine, ns: bytes, lo: datetime, hi: datetime) -> list[dict[str, Any]]:
    """The source roots settled in [lo, hi), in (settled, id) order, each with its attempts."""
    with engine.connect() as conn:
        roots = [dict(r._mapping) for r in conn.execute(
            select(tasks).where(tasks.c.namespace_id == ns, tasks.c.finished_at >= lo,
                                tasks.c.finished_at < hi)
            .order_by(tasks.c.finished_at, tasks.c.id))]  # fmt: skip
        kids: dict[bytes, list[dict[str, Any]]] = {}
        a = task_attempts.c
        q = select(task_attempts).where(a.namespace_id == ns).order_by(a.task_id, a.attempt_no)
        for r in conn.execute(q):
            kids.setdefault(r.task_id, []).append(dict(r._mapping))
    for root in roots:
        root["attempts_rows"] = kids.get(root["id"], [])
    return roots


def _json_value(value: Any) -> Any:
    """What the archive's JSON holds for a source value (written here, not by the product)."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


def _ts(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _assert_jsonl(path: Path, expected: list[dict[str, Any]]) -> None:
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == len(expected)
    for raw, want in zip(lines[:-1], expected, strict=True):
        line = json.loads(raw)
        # canonical JSON, as archived: sorted keys, no spaces, raw UTF-8
        assert raw == json.dumps(line, sort_keys=True, separators=(",", ":"),
                                 ensure_ascii=False).encode("utf-8")  # fmt: skip
        root = {k: _json_value(v) for k, v in want.items() if k != "attempts_rows"}
        assert line["root"] == root
        kids = [{k: _json_value(v) for k, v in r.items()} for r in want["attempts_rows"]]
        assert line["children"] == {"orbit_task_attempts": kids}


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.replace(tzinfo=UTC)


def _assert_parquet(path: Path, expected: list[dict[str, Any]]) -> None:
    """DuckDB reads the file: counts, every value of every root and child, typed."""
    schema = pq.read_schema(path)
    assert str(schema.field("id").type) == "fixed_size_binary[16]"
    assert str(schema.field("finished_at").type) == "timestamp[us, tz=UTC]"
    assert str(schema.field("attempts").type) == "uint32"
    assert not schema.field("request_json").nullable and schema.field("result_json").nullable
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        q = f"SELECT * FROM read_parquet('{path}') ORDER BY finished_at, id"
        cur = con.execute(q)
        names = [d[0] for d in cur.description]
        got = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        assert con.execute(f"SELECT count(*) FROM read_parquet('{path}')").fetchone() == (
            len(expected),
        )
        kid_count = con.execute(
            f"SELECT count(*) FROM read_parquet('{path}'), unnest(orbit_task_attempts)"
        ).fetchone()
        assert kid_count == (sum(len(r["attempts_rows"]) for r in expected),)
        described = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
        types = {r[0]: r[1] for r in described}
    finally:
        con.close()
    assert types["finished_at"] == "TIMESTAMP WITH TIME ZONE" and types["id"] == "BLOB"
    assert len(got) == len(expected)
    for have, want in zip(got, expected, strict=True):
        for col, value in want.items():
            if col == "attempts_rows":
                kids = have["orbit_task_attempts"]
                assert len(kids) == len(value)
                for k_have, k_want in zip(kids, value, strict=True):
                    for kc, kv in k_want.items():
                        exp = _utc(kv) if isinstance(kv, datetime) else kv
                        assert k_have[kc] == exp, (col, kc)
                continue
            exp = _utc(value) if isinstance(value, datetime) else value
            assert have[col] == exp, col
            if isinstance(value, str):
                assert type(have[col]) is str and have[col] == value  # unicode, byte-exact


def _export(env: dict[str, str], ns: str, vols: list[str], lo: datetime, hi: datetime,
            fmt: str, out: Path, *more: str) -> Any:  # fmt: skip
    args = ["archive", "export", ns, "tasks", "--settled-from", _ts(lo), "--settled-until",
            _ts(hi), "--format", fmt, "--out", str(out), "--json", *more]  # fmt: skip
    for v in vols:
        args += ["--volume", v]
    proc = run_orbit(args, env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _roots(env: dict[str, str], ns: str, vols: list[str], lo: datetime, hi: datetime) -> Any:
    args = ["archive", "roots", ns, "tasks", "--settled-from", _ts(lo),
            "--settled-until", _ts(hi), "--json"]  # fmt: skip
    for v in vols:
        args += ["--volume", v]
    proc = run_orbit(args, env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def aws(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """The server's credentials in this process's AWS chain too (the in-process runner)."""
    for k, v in moto.env().items():
        monkeypatch.setenv(k, v)
    return moto


@pytest.mark.mariadb
@pytest.mark.redis
def test_a_window_across_three_jobs_on_folders_and_s3(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, aws: MotoServer
) -> None:
    """Job 1 [beginning, now-40d) on folder A, job 2 [now-40d, now-20d) on S3, job 3 [now-20d,
    now-1h) on folder C; the window [now-50d, now-10d) takes the end of job 1, job 2 whole and
    the start of job 3: exactly the source's roots of the window, in order, with children;
    only the files that overlap the window are decoded."""
    moto = aws
    with archive_env(mariadb_url, platform_engine, tmp_path, **moto.env()) as ae:
        engine = ae.engine
        ns, queue = make_namespace(engine, "exp")
        vol_a, vol_c = tmp_path / "a", tmp_path / "c"
        sid_a, sid_c = make_volume(engine, vol_a), make_volume(engine, vol_c)
        url = f"s3://{moto.bucket(bucket_name('export'))}/arch"
        sid_s3 = bytes.fromhex(cli_json(ae.orbit(*moto.init_args(url), "--json"))["id"])
        loc = S3Location(url[5:].split("/")[0], "arch", moto.endpoint, REGION, True)
        _settled_history(engine, ns, queue, 120, days=60)
        with engine.connect() as conn:
            now = db_now(conn)
        odd = _odd_root(engine, ns, queue, now - timedelta(days=30))

        make_plan(engine, ns, "tasks", sid_a, batch_size=4, archive_after=40 * DAY)
        job1 = _archive(engine, ae.settings, ns, {sid_a.hex(): vol_a})
        make_plan(engine, ns, "tasks", sid_s3, batch_size=4, archive_after=20 * DAY)
        make_due(engine, ns, "tasks")
        job2 = _archive(engine, ae.settings, ns, {sid_s3.hex(): loc})
        make_plan(engine, ns, "tasks", sid_c, batch_size=4, archive_after=3600)
        make_due(engine, ns, "tasks")
        job3 = _archive(engine, ae.settings, ns, {sid_c.hex(): vol_c})
        with engine.connect() as conn:
            r1, r2, r3 = (job_store.job_range(conn, j) for j in (job1, job2, job3))
        assert r1.until == r2.from_ and r2.until == r3.from_
        lo, hi = r1.until - timedelta(days=10), r3.from_ + timedelta(days=10)
        expected = _source(engine, ns, lo, hi)
        assert odd in [r["id"] for r in expected]
        ids = [r["id"] for r in expected]
        before = sum(1 for r in _source(engine, ns, r1.from_ or datetime(2000, 1, 1), lo))
        assert before > 0 and len(ids) < job1.roots + job2.roots + job3.roots

        env = orbit_env(mariadb_url, **moto.env())
        vols = [str(vol_a), url, str(vol_c)]
        summary = _export(env, "exp", vols, lo, hi, "jsonl", tmp_path / "w.jsonl")
        _assert_jsonl(tmp_path / "w.jsonl", expected)
        assert summary["roots"] == len(expected) and summary["uncovered"] == []
        reads = {j["job_id"]: j for j in summary["jobs"]}
        assert list(reads) == [job1.id.hex(), job2.id.hex(), job3.id.hex()]
        assert 0 < reads[job1.id.hex()]["files_decoded"] < job1.batches  # its end only
        assert reads[job2.id.hex()]["files_decoded"] == job2.batches  # whole
        assert 0 < reads[job3.id.hex()]["files_decoded"] < job3.batches  # its start only
        assert sum(j["roots"] for j in summary["jobs"]) == len(expected)

        pq_summary = _export(env, "exp", vols, lo, hi, "parquet", tmp_path / "w.parquet")
        assert pq_summary["roots"] == len(expected)
        _assert_parquet(tmp_path / "w.parquet", expected)

        listing = _roots(env, "exp", vols, lo, hi)
        assert sorted(listing) == ["items", "next"] and listing["next"] is None
        assert [bytes.fromhex(i["id"]) for i in listing["items"]] == ids
        by_job = {i["job_id"] for i in listing["items"]}
        assert by_job == {job1.id.hex(), job2.id.hex(), job3.id.hex()}
        odd_ref = next(i for i in listing["items"] if i["id"] == odd.hex())
        assert odd_ref["job_id"] == job2.id.hex() and odd_ref["settled"].endswith(".000001Z")
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".w")) == []

        # a flipped byte in an object of job 2 on S3: exit 1 naming it, nothing written
        prefix = loc.key(f"{ns.hex()}/{job2.id.hex()}/")
        key = [k for k in moto.keys(loc.bucket, prefix) if k.endswith(".jsonl.gz")][0]
        body = bytearray(moto.client().get_object(Bucket=loc.bucket, Key=key)["Body"].read())
        body[30] ^= 0x01
        moto.client().put_object(Bucket=loc.bucket, Key=key, Body=bytes(body))
        args = ["archive", "export", "exp", "tasks", "--settled-from", _ts(lo),
                "--settled-until", _ts(hi), "--format", "parquet", "--out",
                str(tmp_path / "bad.parquet")]  # fmt: skip
        for v in vols:
            args += ["--volume", v]
        bad = run_orbit(args, env)
        assert_one_line_error(bad, 1, key.rsplit("/", 1)[1], f"s3://{loc.bucket}/")
        assert not (tmp_path / "bad.parquet").exists()
        assert [p for p in tmp_path.iterdir() if p.name.startswith(".bad")] == []


def test_sqlite_platform_two_jobs_jsonl_parquet_and_open_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform on SQLite: an open window is every archived root; --force replaces."""
    url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
    with migrated_engine(url, "platform"):
        pass
    engine = make_engine(url)
    try:
        ns, queue = make_namespace(engine, "lite")
        vol = tmp_path / "vol"
        sid = make_volume(engine, vol)
        _settled_history(engine, ns, queue, 30, days=20)
        settings = load_settings({"ORBIT_DATABASE_URL": url, "ORBIT_VAR_DIR": str(tmp_path)})
        make_plan(engine, ns, "tasks", sid, batch_size=7, archive_after=10 * DAY)
        job1 = _archive(engine, settings, ns, {sid.hex(): vol})
        make_plan(engine, ns, "tasks", sid, batch_size=7, archive_after=3600)
        make_due(engine, ns, "tasks")
        job2 = _archive(engine, settings, ns, {sid.hex(): vol})
        with engine.connect() as conn:
            r2 = job_store.job_range(conn, job2)
        expected = _source(engine, ns, datetime(2000, 1, 1), r2.until)
        assert len(expected) == job1.roots + job2.roots > 0
        env = orbit_env(url)
        out = tmp_path / "all.jsonl"
        base = ["archive", "export", "lite", "tasks", "--volume", str(vol), "--out", str(out)]
        done = run_orbit([*base, "--format", "jsonl"], env)
        assert done.returncode == 0, done.stderr
        assert f"exported {len(expected)} roots of 2 jobs" in done.stdout
        _assert_jsonl(out, expected)
        again = run_orbit([*base, "--format", "parquet"], env)
        assert_one_line_error(again, 3, str(out), "--force")
        _assert_jsonl(out, expected)  # untouched
        forced = run_orbit([*base, "--format", "parquet", "--force"], env)
        assert forced.returncode == 0, forced.stderr
        _assert_parquet(out, expected)
        # row groups bound the memory: 4 roots each here (in-process, the same writer)
        monkeypatch.setattr(parquet, "ROW_GROUP_ROOTS", 4)
        grouped = tmp_path / "grouped.parquet"
        places = {sid: FolderStorage(vol)}
        result = export_window(
            engine, ns, "lite", "tasks", Window(None, None), places, ExportFormat.PARQUET, grouped
        )
        assert result.read.roots == len(expected) and result.bytes == grouped.stat().st_size
        meta = pq.ParquetFile(grouped).metadata
        assert meta.num_row_groups == -(-len(expected) // 4)
        assert max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) == 4
        _assert_parquet(grouped, expected)
        # the window's bounds to the microsecond: a root settled at --settled-from is in, one
        # settled at --settled-until is out (the 6th and the 21st roots of the archive)
        at_from, at_until = expected[5]["finished_at"], expected[20]["finished_at"]
        exact = run_orbit(["archive", "roots", "lite", "tasks", "--volume", str(vol), "--json",
                           "--settled-from", _ts(at_from), "--settled-until", _ts(at_until)],
                          env)  # fmt: skip
        assert exact.returncode == 0, exact.stderr
        listed = [bytes.fromhex(i["id"]) for i in json.loads(exact.stdout)["items"]]
        inside = [r["id"] for r in expected if at_from <= r["finished_at"] < at_until]
        assert listed == inside and expected[5]["id"] in listed
        assert expected[20]["id"] not in listed
        # a window reaching past the archive says so on stderr
        late = run_orbit(["archive", "roots", "lite", "tasks", "--volume", str(vol),
                          "--settled-from", _ts(r2.until - timedelta(days=1)),
                          "--settled-until", _ts(r2.until + timedelta(days=1))], env)  # fmt: skip
        assert late.returncode == 0, late.stderr
        assert f"warning: no SUCCEEDED job covers [{_ts(r2.until)}" in late.stderr
        tail = _source(engine, ns, r2.until - timedelta(days=1), r2.until)
        assert len(late.stdout.splitlines()) == 1 + len(tail)
    finally:
        engine.dispose()


@pytest.fixture
def two_jobs(platform_engine: Engine, mariadb_url: str, tmp_path: Path) -> Iterator[Any]:
    """Two SUCCEEDED jobs of tasks (batch size 3) on one folder, namespace ``bad``."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, queue = make_namespace(ae.engine, "bad")
        vol = tmp_path / "vol"
        sid = make_volume(ae.engine, vol)
        _settled_history(ae.engine, ns, queue, 40, days=20)
        make_plan(ae.engine, ns, "tasks", sid, batch_size=3, archive_after=10 * DAY)
        job1 = _archive(ae.engine, ae.settings, ns, {sid.hex(): vol})
        make_plan(ae.engine, ns, "tasks", sid, batch_size=3, archive_after=3600)
        make_due(ae.engine, ns, "tasks")
        job2 = _archive(ae.engine, ae.settings, ns, {sid.hex(): vol})
        yield ae, vol, job1, job2


def _batch_files(vol: Path, job: Job) -> list[Path]:
    return sorted(job_dir(vol, job.namespace_id, job.id).glob("*.jsonl.gz"))


def _flip(path: Path, at: int = 40) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.mariadb
@pytest.mark.redis
def test_a_tampered_file_is_named_and_nothing_is_written(two_jobs: Any, tmp_path: Path) -> None:
    ae, vol, job1, job2 = two_jobs
    env = orbit_env(ae.url)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    whole = ["archive", "export", "bad", "tasks", "--volume", str(vol), "--format"]
    # a flipped byte in a middle file of job 2 (inside the window): exit 1 naming it
    victim = _batch_files(vol, job2)[len(_batch_files(vol, job2)) // 2]
    original = victim.read_bytes()
    _flip(victim)
    for fmt in ("jsonl", "parquet"):
        proc = run_orbit([*whole, fmt, "--out", str(out_dir / f"x.{fmt}")], env)
        assert_one_line_error(proc, 1, victim.name, job2.id.hex())
    roots = run_orbit(["archive", "roots", "bad", "tasks", "--volume", str(vol), "--json"], env)
    assert_one_line_error(roots, 1, victim.name)
    assert list(out_dir.iterdir()) == []  # no output, no temp file
    victim.write_bytes(original)
    # a file after the window's end is read walking back from the tail: its hash is checked too
    with ae.engine.connect() as conn:
        r1 = job_store.job_range(conn, job1)
    first_of_job2 = _batch_files(vol, job2)[0]
    last_of_job2 = _batch_files(vol, job2)[-1]
    _flip(last_of_job2)
    early = run_orbit([*whole, "jsonl", "--out", str(out_dir / "early.jsonl"),
                       "--settled-until", _ts(r1.until + timedelta(seconds=1))], env)  # fmt: skip
    assert_one_line_error(early, 1, last_of_job2.name)
    assert list(out_dir.iterdir()) == []
    assert first_of_job2.exists()
    # job 2 is outside a window that ends where it starts: not read, its bad file not seen
    fine = run_orbit([*whole, "jsonl", "--out", str(out_dir / "w.jsonl"),
                      "--settled-until", _ts(r1.until)], env)  # fmt: skip
    assert fine.returncode == 0, fine.stderr
    assert (out_dir / "w.jsonl").read_bytes().count(b"\n") == job1.roots
    # a second file at a chain position of job 1 is refused by the listing, by name
    first = _batch_files(vol, job1)[0]
    second = first.with_name(first.name[:9] + "0" * 64 + ".jsonl.gz")
    second.write_bytes(first.read_bytes())
    doubled = run_orbit([*whole, "jsonl", "--out", str(out_dir / "d.jsonl")], env)
    assert_one_line_error(doubled, 1, second.name, "second file for chain position 1")
    assert sorted(p.name for p in out_dir.iterdir()) == ["w.jsonl"]


@pytest.mark.mariadb
@pytest.mark.redis
def test_bad_input_is_one_line_and_writes_nothing(two_jobs: Any, tmp_path: Path) -> None:
    ae, vol, job1, job2 = two_jobs
    env = orbit_env(ae.url)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "taken.jsonl").write_bytes(b"keep me\n")
    other = tmp_path / "other"
    make_volume(ae.engine, other)
    out = str(out_dir / "x.jsonl")

    def export(*args: str) -> list[str]:
        return ["archive", "export", *args]

    v = ["--volume", str(vol)]
    cases = [
        (export("nobody", "tasks", *v, "--format", "jsonl", "--out", out), 4, "nobody"),
        (export("bad", "nope", *v, "--format", "jsonl", "--out", out), 2, "nope"),
        (export("bad", "tasks", *v, "--format", "jsonl", "--out", out,
                "--settled-from", "2026-03-02", "--settled-until", "2026-03-01"), 2,
         "--settled-from 2026-03-02T00:00:00.000000Z must be before --settled-until"),
        (export("bad", "tasks", *v, "--format", "jsonl", "--out", out,
                "--settled-from", "2026-13-01"), 2, "is not a UTC timestamp"),
        (export("bad", "tasks", *v, "--format", "csv", "--out", out), 2, "csv"),
        (export("bad", "tasks", *v, "--format", "jsonl", "--out",
                str(out_dir / "taken.jsonl")), 3, "taken.jsonl exists"),
        (export("bad", "tasks", *v, "--format", "jsonl", "--out",
                str(out_dir / "no" / "x.jsonl")), 2, "does not exist"),
        (export("bad", "tasks", *v, "--format", "jsonl", "--out", str(out_dir)), 2,
         "is a directory"),
        (export("bad", "tasks", "--volume", str(other), "--format", "jsonl", "--out", out), 2,
         job1.storage_id.hex()),
        (export("bad", "tasks", *v, "--format", "jsonl", "--out", out,
                "--settled-from", "2999-01-01"), 4, "covers the settled window"),
        (["archive", "roots", "bad", "tasks", *v, "--settled-from", "2026-03-02",
          "--settled-until", "2026-03-02"], 2, "must be before --settled-until"),
        (["archive", "roots", "bad", "tasks", "--settled-from", "2026-03-02"], 2,
         "--volume"),
    ]  # fmt: skip
    for args, code, needle in cases:
        assert_one_line_error(run_orbit(args, env), code, needle)
        assert sorted(p.name for p in out_dir.iterdir()) == ["taken.jsonl"], args
    assert (out_dir / "taken.jsonl").read_bytes() == b"keep me\n"
    # an install without the parquet extra: one line saying how to get it, nothing written
    shim = tmp_path / "no-pyarrow"
    (shim / "pyarrow").mkdir(parents=True)
    (shim / "pyarrow" / "__init__.py").write_text("raise ImportError('no pyarrow here')\n")
    bare = {**env, "PYTHONPATH": str(shim)}
    proc = run_orbit(export("bad", "tasks", *v, "--format", "parquet", "--out", out), bare)
    assert_one_line_error(proc, 1, "pip install 'orbit-tasks[parquet]'")
    assert sorted(p.name for p in out_dir.iterdir()) == ["taken.jsonl"]


@pytest.mark.mariadb
def test_format1_archive_exports_typed_from_todays_tables(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """An orbit-archive/1 job (tests/fixtures) exports: jsonl as archived, Parquet typed from
    today's tables, as a restore decodes it."""
    from tests.support.restore import fixture_rows, install_format1_fixture

    ns, _job, volume = install_format1_fixture(platform_engine, tmp_path)
    env = orbit_env(mariadb_url)
    rows = fixture_rows("source-rows.json")
    base = ["archive", "export", ns.hex(), "tasks", "--volume", str(volume)]
    for fmt in ("jsonl", "parquet"):
        out = tmp_path / f"f1.{fmt}"
        proc = run_orbit([*base, "--format", fmt, "--out", str(out), "--json"], env)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["jobs"][0]["format"] == "orbit-archive/1"
        assert doc["roots"] == len(rows["orbit_tasks"])
    # jsonl is the batch files' root lines, byte for byte (gunzip, header line dropped)
    archived = b"".join(
        gzip.decompress(f.read_bytes()).split(b"\n", 1)[1]
        for f in sorted((volume / ns.hex() / _job.hex()).glob("*.jsonl.gz"))
    )
    assert (tmp_path / "f1.jsonl").read_bytes() == archived
    con = duckdb.connect()
    try:
        got = con.execute(
            f"SELECT id, request_json, len(orbit_task_attempts) FROM "
            f"read_parquet('{tmp_path / 'f1.parquet'}')"
        ).fetchall()
    finally:
        con.close()
    want = {r["id"]: r["request_json"] for r in rows["orbit_tasks"]}
    assert {bytes(i): j for i, j, _ in got} == want
    kids = sum(n for _, _, n in got)
    assert kids == len(rows["orbit_task_attempts"])


def test_every_history_kind_has_a_parquet_schema() -> None:
    """Each column type the history tables use maps to its Arrow type (pure: no file), and the
    nullability and child tables of the description are kept."""
    from orbit_tasks.archive.format.manifest import source_descriptor
    from orbit_tasks.archive.format.tables import parse_source
    from orbit_tasks.platform.history import HISTORY_KINDS

    want = {
        "BINARY(16)": "fixed_size_binary[16]",
        "DATETIME(6)": "timestamp[us, tz=UTC]",
        "INT UNSIGNED": "uint32",
    }  # every non-text type the history tables use
    seen = set()
    for kind in HISTORY_KINDS.values():
        schema = parse_source(source_descriptor(kind))
        arrow = parquet.arrow_schema(schema)
        assert arrow.names == [*schema.root.names, *(s.name for s, _ in schema.children)]
        for spec in schema.tables:
            fields = arrow if spec is schema.root else arrow.field(spec.name).type.value_type
            for col in spec.columns:
                got = fields.field(col.name) if spec is not schema.root else arrow.field(col.name)
                expected = "string" if col.encoding == "text" else want[col.type]
                assert str(got.type) == expected, (spec.name, col.name, col.type)
                assert got.nullable == col.nullable, (spec.name, col.name)
                seen.add(col.type)
    assert {"BINARY(16)", "DATETIME(6)", "INT UNSIGNED"} <= seen


def test_parquet_needs_one_description_across_the_window() -> None:
    """Two jobs whose descriptions differ (a column added between them) cannot share a typed
    file: the later job is named (pure: descriptions only)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from orbit_tasks.archive.format.manifest import source_descriptor
    from orbit_tasks.archive.format.tables import parse_source
    from orbit_tasks.archive.restore.window import same_schemas
    from orbit_tasks.errors import OrbitError
    from orbit_tasks.platform.history import HISTORY_KINDS

    schema = parse_source(source_descriptor(HISTORY_KINDS["tasks"]))
    narrower = replace(schema, root=replace(schema.root, columns=schema.root.columns[:-1]))

    def job(n: int, s: Any) -> Any:
        return SimpleNamespace(job=SimpleNamespace(id=bytes([n]) * 16), schema=s)

    assert same_schemas([job(1, schema), job(2, schema)]) == schema
    assert same_schemas([]) is None
    with pytest.raises(OrbitError, match=f"job {'02' * 16} describes its tables otherwise"):
        same_schemas([job(1, schema), job(2, narrower)])


def test_one_file_checks_of_a_partial_reader() -> None:
    """chain.check_manifest / check_batch (pure, on a built chain): the file at its position
    passes; another link, position, an earlier key, a manifest of another job or a changed
    byte is refused with the reason."""
    from orbit_tasks.archive.format.chain import check_batch, check_manifest
    from orbit_tasks.archive.format.values import FormatError
    from tests.support.archive_chain import build_chain, with_expect

    chain = build_chain()
    (m_name, m_data), (n1, _), (n2, d2), _ = chain.files  # batch 1 is never read
    man = check_manifest(m_name, m_data, chain.expect)
    link1 = n1.split("-")[1].split(".")[0]
    ok = check_batch(2, n2, d2, expect=chain.expect, manifest=man, link=link1, after=None)
    assert ok.header["seq"] == 2 and len(ok.lines) == 2
    cases = [
        (dict(seq=2, name=n2, data=d2, link=m_name[9:73]), "prev_sha256"),
        (dict(seq=1, name=n2, data=d2, link=link1), "not the name of chain file 1"),
        (dict(seq=2, name=n2, data=d2[:-1] + bytes([d2[-1] ^ 1]), link=link1), "hash"),
    ]
    for kw, reason in cases:
        with pytest.raises(FormatError, match=reason):
            check_batch(kw["seq"], kw["name"], kw["data"], expect=chain.expect, manifest=man,
                        link=kw["link"], after=None)  # fmt: skip
    with pytest.raises(FormatError, match="overlap or precede"):
        check_batch(2, n2, d2, expect=chain.expect, manifest=man, link=link1,
                    after=("9999-01-01T00:00:00.000000Z", "00" * 16))  # fmt: skip
    with pytest.raises(FormatError, match="manifest job_id differs"):
        check_manifest(m_name, m_data, with_expect(chain, job_id=b"\x09" * 16))
