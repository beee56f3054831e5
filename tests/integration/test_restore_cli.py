"""``orbit job restore`` / ``orbit archive restore`` beyond the happy path (real MariaDB, real
files, the real CLI; jobs are archived by the in-process runner): conflicts, a corrupt batch,
the live source database, windows over several jobs and volumes, bad input, query plans."""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, inspect, select, text, update

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.engine.volume import job_dir
from orbit_tasks.archive.jobs import Job
from orbit_tasks.archive.restore import store as restore_store
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import source
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.history_tables import task_attempts, tasks
from orbit_tasks.db.migrate import upgrade
from orbit_tasks.dev import generator
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.archive_jobs import (
    ArchiveEnv,
    archive_env,
    make_due,
    make_namespace,
    make_plan,
    make_volume,
)
from tests.support.cli import assert_one_line_error, orbit_env, run_orbit
from tests.support.db import mariadb_database
from tests.support.fs import small_tmpfs
from tests.support.restore import (
    assert_rows_identical,
    reflected_rows,
    source_rows,
)

pytestmark = [pytest.mark.mariadb]
DAY = 86400


def archive_now(ae: ArchiveEnv, ns: bytes, kind: str, sid: bytes, vol: Path) -> Job:
    """One tick for (ns, kind) and the in-process runner until the job is SUCCEEDED."""
    job_hex = next(j for n, k, j in ae.tick().jobs_created if n == ns.hex() and k == kind)
    out = None
    while out in (None, "released"):
        out = runner.run_job(ns.hex(), job_hex, {sid.hex(): vol}, ae.settings,
                             engine=ae.engine, publish=lambda *a, **k: None)  # fmt: skip
    assert out == "succeeded", out
    return ae.job(ns, bytes.fromhex(job_hex))


@pytest.fixture
def target_url() -> Iterator[str]:
    with mariadb_database("orbit_r") as url:
        yield url


def seed_settled(engine: Engine, ns: bytes, queue: bytes, roots: int, days: int = 2) -> None:
    """``roots`` settled tasks (two attempts each) over the last ``days`` days."""
    spec = generator.make_spec("tasks", roots, 2, days=days, settled_fraction=1.0)
    with engine.begin() as conn:
        generator.seed_history(conn, spec, ns, [queue], random.Random(roots), db_now(conn))


def _tasks_job(ae: ArchiveEnv, tmp: Path, roots: int = 10) -> tuple[Job, Path]:
    ns, queue = make_namespace(ae.engine, "rns")
    vol = tmp / "vol"
    sid = make_volume(ae.engine, vol)
    make_plan(ae.engine, ns, "tasks", sid, batch_size=4)
    seed_settled(ae.engine, ns, queue, roots)
    job = archive_now(ae, ns, "tasks", sid, vol)
    assert job.batches == 3, job  # 4 + 4 + the rest
    return job, vol


def _args(job: Job, vol: Path, into: str, *more: str) -> list[str]:
    return ["job", "restore", job.namespace_id.hex(), job.id.hex(), "--volume", str(vol),
            "--into", into, *more]  # fmt: skip


def _root_ids(engine: Engine, job: Job) -> list[bytes]:
    with engine.connect() as conn:
        rng = job_store.job_range(conn, job)
        return source.root_keys_in_range(conn, job.kind, job.namespace_id, rng)


def _count(url: str, table: Any) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(table.name):
                return -1
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())
    finally:
        engine.dispose()


def test_conflict_leaves_its_batch_unwritten_and_exits_3(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, target_url: str
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        job, vol = _tasks_job(ae, tmp_path)
        env = orbit_env(mariadb_url)
        assert run_orbit(_args(job, vol, target_url), env).returncode == 0
        ids = _root_ids(platform_engine, job)  # archive order: batch 1 = ids[0:4], 2 = [4:8]
        target = make_engine(target_url)
        with target.begin() as conn:
            conn.execute(update(tasks).where(tasks.c.id == ids[5]).values(state="TAMPERED"))
            conn.execute(delete(task_attempts).where(task_attempts.c.task_id == ids[6]))
            conn.execute(delete(tasks).where(tasks.c.id.in_([ids[6], ids[9]])))
        proc = run_orbit(_args(job, vol, target_url, "--json"), env)
        assert proc.returncode == 3, proc.stderr
        assert "1 row(s) differ" in proc.stderr and "1 batch(es) were not written" in proc.stderr
        summary = json.loads(proc.stdout.splitlines()[-1])
        assert summary["ok"] is False
        assert summary["conflicts"] == [
            {
                "job_id": job.id.hex(),
                "seq": 2,
                "table": "orbit_tasks",
                "key": {"namespace_id": job.namespace_id.hex(), "id": ids[5].hex()},
                "columns": ["state"],
            }
        ]
        assert "TAMPERED" not in proc.stdout + proc.stderr  # keys and column names only
        with target.connect() as conn:
            present = {r[0] for r in conn.execute(select(tasks.c.id))}
            kids = {r[0] for r in conn.execute(select(task_attempts.c.task_id))}
        assert ids[6] not in present and ids[6] not in kids  # batch 2: nothing written
        assert ids[9] in present  # batch 3 was written
        assert summary["inserted"] == {"orbit_tasks": 1}  # ids[9] kept its attempts
        human = run_orbit(_args(job, vol, target_url), env)
        assert human.returncode == 3
        assert "restore [" in human.stderr and "3/3 batches" in human.stderr  # the bar
        assert f'conflict: orbit_tasks {{"id": "{ids[5].hex()}"' in human.stdout
        target.dispose()


def test_a_flipped_byte_in_a_middle_batch_writes_nothing(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, target_url: str
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        job, vol = _tasks_job(ae, tmp_path)
        directory = job_dir(vol, job.namespace_id, job.id)
        middle = sorted(p for p in directory.iterdir() if p.name.startswith("00000002-"))[0]
        data = bytearray(middle.read_bytes())
        data[len(data) // 2] ^= 0x01
        middle.write_bytes(bytes(data))
        env = orbit_env(mariadb_url)
        proc = run_orbit(_args(job, vol, target_url), env)
        assert proc.returncode == 1, proc.stderr
        assert middle.name in proc.stderr and "first bad file" in proc.stderr
        assert _count(target_url, tasks) == -1  # not even a table was made
        sqlite_file = tmp_path / "out.sqlite3"
        proc = run_orbit(_args(job, vol, f"sqlite:///{sqlite_file}"), env)
        assert proc.returncode == 1 and middle.name in proc.stderr
        assert not sqlite_file.exists()
        # archive restore verifies every job first: the good rows of batch 1 are not written
        kinds = run_orbit(["archive", "restore", "rns", "tasks", "--volume", str(vol),
                           "--into", target_url], env)  # fmt: skip
        assert kinds.returncode == 1 and middle.name in kinds.stderr
        assert _count(target_url, tasks) == -1


def test_live_source_refused_unless_into_source(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        job, vol = _tasks_job(ae, tmp_path)
        env = orbit_env(mariadb_url)
        aliases = [mariadb_url, mariadb_url.replace("127.0.0.1", "localhost"),
                   mariadb_url.replace("mysql+mysqldb://", "mariadb://")]  # fmt: skip
        for alias in aliases:
            proc = run_orbit(_args(job, vol, alias), env)
            assert proc.returncode == 2, (alias, proc.stderr)
            assert "live platform database" in proc.stderr and "--into-source" in proc.stderr
        # deleted history restored in place
        ids = _root_ids(platform_engine, job)
        before = source_rows(platform_engine, tasks, job.namespace_id, ids)
        kids_before = source_rows(platform_engine, task_attempts, job.namespace_id, ids, "task_id")
        with platform_engine.begin() as conn:
            conn.execute(delete(task_attempts).where(task_attempts.c.task_id.in_(ids[:5])))
            conn.execute(delete(tasks).where(tasks.c.id.in_(ids[:5])))
        proc = run_orbit(_args(job, vol, aliases[1], "--into-source", "--json"), env)
        assert proc.returncode == 0, proc.stderr
        assert "note: restoring into the live platform database" in proc.stderr
        summary = json.loads(proc.stdout.splitlines()[-1])
        assert summary["inserted"] == {"orbit_tasks": 5, "orbit_task_attempts": 10}
        assert summary["skipped"] == {"orbit_tasks": 5, "orbit_task_attempts": 10}
        assert_rows_identical(before, source_rows(platform_engine, tasks, job.namespace_id, ids),
                              "tasks")  # fmt: skip
        after = source_rows(platform_engine, task_attempts, job.namespace_id, ids, "task_id")
        assert_rows_identical(kids_before, after, "attempts")
        # another schema on the same server is not the source
        with mariadb_database("orbit_r") as other:
            assert run_orbit(_args(job, vol, other), env).returncode == 0


def test_sqlite_source_is_recognised_through_another_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    os.symlink(real, link)
    source_db = make_engine(f"sqlite:///{real / 'platform.sqlite3'}")
    upgrade(source_db, "platform")
    same = make_engine(f"sqlite:///{link / 'platform.sqlite3'}")
    other = make_engine(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    try:
        assert restore_store.same_database(source_db, same)
        assert not restore_store.same_database(source_db, other)
        assert not (tmp_path / "other.sqlite3").exists()  # the probe made no file
    finally:
        for e in (source_db, same, other):
            e.dispose()


def test_archive_restore_a_window_over_jobs_on_two_volumes(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, target_url: str
) -> None:
    """Job 1 archives [beginning, now-30d) on volume A, job 2 [now-30d, now-1h) on volume B.
    A window across the boundary gets exactly the roots settled inside it, from both jobs."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, queue = make_namespace(platform_engine, "months")
        vol_a, vol_b = tmp_path / "a", tmp_path / "b"
        sid_a, sid_b = make_volume(platform_engine, vol_a), make_volume(platform_engine, vol_b)
        make_plan(platform_engine, ns, "tasks", sid_a, batch_size=5, archive_after=30 * DAY)
        seed_settled(platform_engine, ns, queue, 60, days=60)
        job1 = archive_now(ae, ns, "tasks", sid_a, vol_a)
        make_plan(platform_engine, ns, "tasks", sid_b, batch_size=5, archive_after=3600)
        make_due(platform_engine, ns, "tasks")
        job2 = archive_now(ae, ns, "tasks", sid_b, vol_b)
        with platform_engine.connect() as conn:
            r1, r2 = job_store.job_range(conn, job1), job_store.job_range(conn, job2)
        assert r1.until == r2.from_ and job1.roots > 0 and job2.roots > 0
        lo, hi = r1.until - timedelta(days=10), r1.until + timedelta(days=10)
        env = orbit_env(mariadb_url)
        base = ["archive", "restore", "months", "tasks", "--into", target_url,
                "--from", lo.isoformat() + "Z", "--until", hi.isoformat()]  # fmt: skip

        only_a = run_orbit([*base, "--volume", str(vol_a)], env)
        assert only_a.returncode == 2 and sid_b.hex() in only_a.stderr, only_a.stderr
        assert _count(target_url, tasks) == -1

        skip = run_orbit([*base, "--volume", str(vol_a), "--skip-missing-volumes", "--json"], env)
        assert skip.returncode == 0, skip.stderr
        assert f"skipped: job {job2.id.hex()}" in skip.stderr
        summary = json.loads(skip.stdout.splitlines()[-1])
        assert [j["job_id"] for j in summary["jobs"]] == [job1.id.hex()]
        assert summary["skipped_jobs"] == [{"job_id": job2.id.hex(), "storage_id": sid_b.hex()}]

        both = run_orbit([*base, "--volume", str(vol_b), "--volume", str(vol_a), "--json"], env)
        assert both.returncode == 0, both.stderr
        summary = json.loads(both.stdout.splitlines()[-1])
        assert [j["job_id"] for j in summary["jobs"]] == [job1.id.hex(), job2.id.hex()]
        assert summary["uncovered"] == []
        with platform_engine.connect() as conn:
            q = select(tasks.c.id).where(tasks.c.namespace_id == ns, tasks.c.finished_at >= lo,
                                         tasks.c.finished_at < hi)  # fmt: skip
            window_ids = [r[0] for r in conn.execute(q)]
        assert window_ids and len(window_ids) < job1.roots + job2.roots
        target = make_engine(target_url)
        try:
            want = source_rows(platform_engine, tasks, ns, window_ids)
            assert_rows_identical(want, reflected_rows(target, "orbit_tasks"), "window roots")
            want_kids = source_rows(platform_engine, task_attempts, ns, window_ids, "task_id")
            assert_rows_identical(want_kids, reflected_rows(target, "orbit_task_attempts"), "kids")
        finally:
            target.dispose()

        # a window reaching past the last archived range says so (and restores what there is)
        later = run_orbit(["archive", "restore", "months", "tasks", "--volume", str(vol_b),
                           "--into", f"sqlite:///{tmp_path / 'late.sqlite3'}",
                           "--from", (r2.until - timedelta(days=1)).isoformat(),
                           "--until", (r2.until + timedelta(days=2)).isoformat(), "--json"],
                          env)  # fmt: skip
        assert later.returncode == 0, later.stderr
        gap = json.loads(later.stdout.splitlines()[-1])["uncovered"]
        assert gap == [{"from": _ts(r2.until), "until": _ts(r2.until + timedelta(days=2))}]
        assert "warning: no SUCCEEDED job covers" in later.stderr
        # no archived range meets the window (it is after the last one): exit 4
        after_all = (r2.until + timedelta(days=1)).isoformat()
        none = run_orbit(["archive", "restore", "months", "tasks", "--volume", str(vol_b),
                          "--into", target_url, "--from", after_all], env)  # fmt: skip
        assert none.returncode == 4 and "covers the window" in none.stderr


def _ts(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_bad_input_and_refusals_write_nothing(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, target_url: str
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        job, vol = _tasks_job(ae, tmp_path)
        env = orbit_env(mariadb_url)
        ns = job.namespace_id.hex()
        cases = [
            (_args(job, vol, "postgresql://u@h/db"), 2, "unsupported scheme 'postgresql'"),
            (_args(job, vol, "::not a url::"), 2, "is not a database URL"),
            (_args(job, tmp_path / "nowhere", target_url), 2, "not an archive volume"),
            (_args(job, vol, target_url.rsplit("/", 1)[0] + "/orbit_no_such_db"), 1,
             "does not exist"),
            (["archive", "restore", ns, "tasks", "--volume", str(vol), "--into", target_url,
              "--from", "2026-13-01"], 2, "is not a UTC timestamp"),
            (["archive", "restore", ns, "tasks", "--volume", str(vol), "--into", target_url,
              "--from", "2026-03-02", "--until", "2026-03-01"], 2, "must be before --until"),
            (["archive", "restore", ns, "nope", "--volume", str(vol), "--into", target_url], 2,
             "is not a history kind"),
            (["job", "restore", ns, "00" * 16, "--volume", str(vol), "--into", target_url], 4,
             "does not exist"),
        ]  # fmt: skip
        for args, code, needle in cases:
            proc = run_orbit(args, env)
            assert proc.returncode == code, (args, proc.returncode, proc.stderr)
            assert needle in proc.stderr, (needle, proc.stderr)
        other_vol = tmp_path / "other"
        make_volume(platform_engine, other_vol)
        wrong = run_orbit(_args(job, other_vol, target_url), env)
        assert wrong.returncode == 2 and "belongs to storage" in wrong.stderr
        # a job that is not SUCCEEDED
        with platform_engine.begin() as conn:
            conn.execute(text("UPDATE orbit_archive_jobs SET state = 'FAILED', "
                              "error_code = 'IO_ERROR'"))  # fmt: skip
        failed = run_orbit(_args(job, vol, target_url), env)
        assert failed.returncode == 3 and "only SUCCEEDED jobs" in failed.stderr
        assert _count(target_url, tasks) == -1
        with platform_engine.begin() as conn:
            conn.execute(text("UPDATE orbit_archive_jobs SET state = 'SUCCEEDED', error_code=''"))
        # an existing target table that cannot hold the rows: exit 3, nothing written
        target = make_engine(target_url)
        with target.begin() as conn:
            conn.execute(text("CREATE TABLE orbit_tasks (namespace_id BINARY(16) NOT NULL, "
                              "id BINARY(16) NOT NULL, finished_at DATETIME NOT NULL, "
                              "PRIMARY KEY (namespace_id, id))"))  # fmt: skip
        target.dispose()
        unfit = run_orbit(_args(job, vol, target_url), env)
        assert unfit.returncode == 3, unfit.stderr
        assert "target table orbit_tasks does not fit" in unfit.stderr
        assert "column queue_id is missing" in unfit.stderr
        assert "finished_at is DATETIME without microseconds" in unfit.stderr
        assert _count(target_url, tasks) == 0 and _count(target_url, task_attempts) == -1


def test_restore_queries_use_their_indexes(platform_engine: Engine) -> None:
    """The jobs page on ix_archive_job_list; the existing-row reads of one full batch on the
    primary key of the root and child tables (here an `orbit db upgrade`'d database; tables made
    by restore have the same primary keys: tests/unit/test_table_schema.py)."""
    from orbit_tasks.archive.format.tables import schema_of

    ns, queue = make_namespace(platform_engine, "plans")
    seed_settled(platform_engine, ns, queue, 2000, days=30)  # a plan needs rows to choose from
    t = datetime(2026, 3, 1)
    q = restore_store.succeeded_jobs_query(ns, "tasks", (t, ns), 500)
    checks = [(q, "ix_archive_job_list")]
    doc = {"format": "orbit-archive/2", "kind": "tasks"}
    from orbit_tasks.archive.format.manifest import source_descriptor

    schema = schema_of({**doc, "source": source_descriptor(HISTORY_KINDS["tasks"])})
    with platform_engine.connect() as conn:  # one full batch (batch_size <= 100) of real ids
        keys = [r[0] for r in conn.execute(select(tasks.c.id).order_by(tasks.c.id).limit(100))]
    for spec, link in [(schema.root, "id"), *schema.children]:
        table = tasks if spec.name == "orbit_tasks" else task_attempts
        checks.append((restore_store.existing_rows_query(table, spec, ns, link, keys), "PRIMARY"))
    with platform_engine.connect() as conn:
        for query, index in checks:  # bound parameters: real ids are not valid text literals
            compiled = query.compile(conn, compile_kwargs={"render_postcompile": True})
            params = tuple(compiled.params[k] for k in compiled.positiontup or ())
            rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), params).mappings().all()
            assert rows[0]["key"] == index, (str(compiled), rows)


def test_gzip_of_a_restored_job_is_untouched(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, target_url: str
) -> None:
    """A restore only reads the volume: every file keeps its bytes (and zcat reads them)."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        job, vol = _tasks_job(ae, tmp_path)
        directory = job_dir(vol, job.namespace_id, job.id)
        before = {p.name: p.read_bytes() for p in directory.iterdir()}
        assert run_orbit(_args(job, vol, target_url), orbit_env(mariadb_url)).returncode == 0
        after = {p.name: p.read_bytes() for p in directory.iterdir()}
        assert before == after
        for name, data in after.items():
            if name.endswith(".gz"):
                assert gzip.decompress(data).startswith(b'{"final":')


def test_a_file_changed_after_verification_stops_the_restore(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, target_url: str
) -> None:
    """Files are re-hashed and re-linked while read: a batch altered between the verification
    and its turn stops the restore there, naming the file (earlier batches stay written)."""
    from orbit_tasks.archive.restore import run as restore

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        job, vol = _tasks_job(ae, tmp_path)
        directory = job_dir(vol, job.namespace_id, job.id)
        archive = restore.open_job(platform_engine, job, directory)
        restore.check_rows(archive)
        last = directory / archive.batch_files[2]  # archive.directory: the storage seam
        data = bytearray(last.read_bytes())
        data[-12] ^= 0x01
        last.write_bytes(bytes(data))
        target = make_engine(target_url)
        seen: list[int] = []
        try:
            with pytest.raises(restore.ArchiveUnreadable, match=last.name):
                restore.restore_job(target, archive, on_batch=lambda b: seen.append(b.seq))
        finally:
            target.dispose()
        assert seen == [1, 2]
        assert _count(target_url, tasks) == 8


def _no_rows_anywhere(target_url: str) -> None:
    engine = make_engine(target_url)
    try:
        with engine.connect() as conn:
            assert inspect(conn).get_table_names() == []  # not even empty target tables
    finally:
        engine.dispose()


def test_bad_into_urls_are_one_line_naming_into(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, target_url: str
) -> None:
    """Issue 14 item 6.1/6.2: an --into URL is checked as ORBIT_DATABASE_URL is (port, parse,
    scheme, database), and its connection charset must be utf8mb4, before anything is written."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        job, vol = _tasks_job(ae, tmp_path)
        env = orbit_env(mariadb_url)
        server = target_url.rsplit("/", 1)[0]
        cases = [
            ("mysql://root@127.0.0.1:abc/x", ["--into", "'abc'", "1..65535"]),
            ("mysql://root:pw9@127.0.0.1:70000/x", ["--into", "70000", "1..65535"]),
            ("mysql://root@[::1/x", ["--into", "cannot be parsed"]),
            ("mysql://root@127.0.0.1:3306", ["--into", "no database"]),
            ("postgresql://u@h/db", ["--into", "'postgresql'", "sqlite:///"]),
            ("::not a url::", ["--into", "'::not a url::'", "://"]),
        ]
        cases += [
            (f"{target_url}?charset={cs}", ["--into", f"charset={cs}", "utf8mb4"])
            for cs in ("latin1", "ascii", "utf8", "utf8mb3")
        ]
        for url, needles in cases:
            proc = run_orbit(_args(job, vol, url), env)
            line = assert_one_line_error(proc, 2, *needles)
            assert "pw9" not in line, line
            assert "unexpected" not in line, line
        _no_rows_anywhere(target_url)
        # archive restore: the same check, before the jobs are read
        ns = job.namespace_id.hex()
        proc = run_orbit(["archive", "restore", ns, "tasks", "--volume", str(vol), "--into",
                          f"{server}/x?charset=latin1"], env)  # fmt: skip
        assert_one_line_error(proc, 2, "--into", "charset=latin1", "utf8mb4")
        # utf8mb4 spelled out is the one allowed charset
        ok = run_orbit(_args(job, vol, f"{target_url}?charset=utf8mb4"), env)
        assert ok.returncode == 0, ok.stderr


def test_sqlite_into_errors_name_the_path(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Issue 14 item 6.3: every failure of a SQLite --into names its file."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        job, vol = _tasks_job(ae, tmp_path)
        env = orbit_env(mariadb_url)
        plain = tmp_path / "plain-file"
        plain.write_text("not a directory")
        garbage = tmp_path / "garbage.sqlite3"
        garbage.write_bytes(b"this is not a SQLite database, just bytes " * 100)
        folder = tmp_path / "a-directory.sqlite3"
        folder.mkdir()
        cases = [
            (plain / "t.sqlite3", 2, ["file exists"]),
            (garbage, 1, ["not a SQLite database"]),
            (folder, 1, ["cannot open the SQLite file"]),
        ]
        with small_tmpfs(tmp_path / "ro", "64k", read_only=True) as ro:
            cases.append((ro / "t.sqlite3", 1, ["cannot open the SQLite file"]))
            for path, code, needles in cases:
                proc = run_orbit(_args(job, vol, f"sqlite:///{path}"), env)
                line = assert_one_line_error(proc, code, str(path), *needles)
                assert "unexpected" not in line, line
        assert garbage.read_bytes().startswith(b"this is not")
        assert os.listdir(folder) == []


def test_manifest_tables_outside_the_kind_are_refused(
    platform_engine: Engine,
    mariadb_url: str,
    tmp_path: Path,
    target_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 14 item 6.5: a verified format-2 job whose manifest names a table that is not one of
    its kind's (here the platform's credential table as the root) is refused before anything is
    written (children: tests/unit/test_restore_kind_tables.py)."""
    from orbit_tasks.archive.format import manifest

    real = manifest.source_descriptor

    def foreign(kind: Any) -> dict[str, Any]:
        return {**real(kind), "table": "orbit_credentials"}

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        monkeypatch.setattr(manifest, "source_descriptor", foreign)
        job, vol = _tasks_job(ae, tmp_path)
        monkeypatch.undo()
        env = orbit_env(mariadb_url)
        assert run_orbit(["job", "verify", job.namespace_id.hex(), job.id.hex(), "--volume",
                          str(vol)], env).returncode == 0  # fmt: skip
        for args in (
            _args(job, vol, target_url),
            ["archive", "restore", job.namespace_id.hex(), "tasks", "--volume", str(vol),
             "--into", target_url],
        ):  # fmt: skip
            proc = run_orbit(args, env)
            line = assert_one_line_error(proc, 1, "orbit_credentials", "'tasks'", "orbit_tasks")
            assert "orbit_task_attempts" in line and "manifest" in line, line
        _no_rows_anywhere(target_url)
