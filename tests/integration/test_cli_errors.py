"""The CLI's error boundary through the real ``orbit`` script (issue 7 items 2, 3 and 5).

Every refused command prints ONE line naming the value or path and what is wrong, exits 2 (bad
input) or 1 (other), never shows a traceback, and writes nothing: no identity file, no temp file,
no directory, no database row. Missing tables name the upgrade command of their database.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from orbit_tasks.archive.engine.volume import IDENTITY_FILE, read_identity
from orbit_tasks.db.engine import make_engine
from orbit_tasks.db.platform_tables import archive_storages
from tests.support.cli import ORBIT, REPO, assert_one_line_error, orbit_env, run_orbit
from tests.support.db import mariadb_database, migrated_engine, server_engine
from tests.support.fs import full_tmpfs, small_tmpfs

# Spare ports of this worktree's test range: nothing listens there (a database that is down).
DEAD_MYSQL = "mysql+mysqldb://root@127.0.0.1:6431/orbit"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
    with migrated_engine(url, "platform"):
        yield url


def _storages(url: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(archive_storages)).scalar())
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- database URLs

BAD_URLS = [
    # (url, exit code, needles in the line, text that must not appear)
    ("postgres://alice:s3cret@db.example/orbit", 2, ["'postgres'", "mysql", "sqlite"], "s3cret"),
    ("postgresql://alice:s3cret@db.example/orbit", 2, ["'postgresql'"], "s3cret"),
    ("localhost/orbit", 2, ["'localhost/orbit'", "://"], None),
    ("mysql://root:pw123@127.0.0.1:abc/orbit", 2, ["'abc'", "1..65535"], "pw123"),
    ("mysql://root@127.0.0.1:99999/orbit", 2, ["99999", "1..65535"], None),
    ("mysql://root:pw123@[::1/orbit", 2, ["***@[::1/orbit'", "cannot be parsed"], "pw123"),
    ("mysql://root@db:1:2/orbit", 2, ["cannot be parsed"], None),
    ("mysql://root@127.0.0.1:3306", 2, ["no database"], None),
    ("sqlite+nosuchdriver:///x.sqlite3", 2, ["'nosuchdriver'"], None),
    ("mysql://root@127.0.0.1:3306/orbit_no_such_db", 1, ["does not exist", "1049"], None),
    ("mysql://nobody:wrong@127.0.0.1:3306/orbit", 1, ["access denied"], "wrong"),
    ("sqlite:////proc/orbit-no-such-dir/platform.sqlite3", 2, ["/proc/orbit-no-such-dir"], None),
]


@pytest.mark.parametrize("url,code,needles,secret", BAD_URLS, ids=[u[0] for u in BAD_URLS])
def test_bad_database_url_is_one_line(
    url: str, code: int, needles: list[str], secret: str | None, tmp_path: Path
) -> None:
    # A SQLite folder that cannot be created shows when the file is to be created: db upgrade.
    args = ["db", "upgrade"] if url.startswith("sqlite:////proc/") else ["namespace", "list"]
    proc = run_orbit(args, orbit_env(url), cwd=tmp_path)
    line = assert_one_line_error(proc, code, "ORBIT_DATABASE_URL", *needles)
    if secret is not None:
        assert secret not in proc.stderr, line
    assert os.listdir(tmp_path) == []  # not even a SQLite file or a var/ folder


def test_bad_business_url_names_its_variable(sqlite_url: str, tmp_path: Path) -> None:
    env = orbit_env(sqlite_url, "postgres://bob:hunter2@db/biz")
    proc = run_orbit(["sender", "list"], env, cwd=tmp_path)
    assert_one_line_error(proc, 2, "ORBIT_SENDER_DATABASE_URL", "'postgres'")
    assert "hunter2" not in proc.stderr


# --------------------------------------------------------------------------- storage init paths


def _full_disk(tmp_path: Path) -> AbstractContextManager[Path]:
    return full_tmpfs(tmp_path / "full")


@contextmanager
def _read_only(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "ro", "64k", read_only=True) as mnt:
        yield mnt


@contextmanager
def _proc(tmp_path: Path) -> Iterator[Path]:
    yield Path("/proc")


@contextmanager
def _regular_file(tmp_path: Path) -> Iterator[Path]:
    plain = tmp_path / "plain-file"
    plain.write_text("not a directory")
    yield plain


PLACES: dict[str, Callable[[Path], AbstractContextManager[Path]]] = {
    "ro": _read_only,
    "full": _full_disk,
    "proc": _proc,
    "file": _regular_file,
}


@pytest.mark.parametrize(
    "where,sub,code,needles",
    [
        ("ro", "vol", 2, ["read-only"]),
        ("ro", "", 2, ["read-only"]),
        ("full", "vol", 1, ["no space"]),
        ("full", "", 1, ["no space"]),
        ("proc", "orbit-volume", 2, []),
        ("proc", "", 3, ["more than 1000 folders"]),  # storages cannot nest: checked first
        ("file", "sub/vol", 2, ["not a directory"]),
    ],
)
def test_storage_init_on_unusable_paths_is_one_line_and_writes_nothing(
    where: str, sub: str, code: int, needles: list[str], sqlite_url: str, tmp_path: Path
) -> None:
    with PLACES[where](tmp_path) as base:
        before = sorted(os.listdir(base)) if where in ("ro", "full") else None
        target = base / sub if sub else base
        proc = run_orbit(
            ["storage", "init", str(target), "--create", "--label", "x"], orbit_env(sqlite_url)
        )
        named = base if where == "file" else target  # the regular file is what is wrong there
        assert_one_line_error(proc, code, str(named), *needles)
        if before is not None:
            assert sorted(os.listdir(base)) == before  # no temp file, no directory
    assert _storages(sqlite_url) == 0


def test_storage_init_with_the_database_down_writes_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    vol = tmp_path / "deep" / "vol"
    proc = run_orbit(
        ["storage", "init", str(vol), "--create", "--label", "a"], orbit_env(DEAD_MYSQL)
    )
    assert_one_line_error(proc, 1, "database unavailable")
    assert not (tmp_path / "deep").exists()  # no identity file, no directory
    # so a rerun against the database that is up may choose another label
    again = run_orbit(
        ["storage", "init", str(vol), "--create", "--label", "b", "--json"], orbit_env(sqlite_url)
    )
    assert again.returncode == 0, again.stderr
    assert read_identity(vol).label == "b"


# --------------------------------------------------------------------------- crash order


def test_crash_after_the_identity_file_before_commit_is_adopted_by_a_rerun(
    sqlite_url: str, tmp_path: Path
) -> None:
    """docs/decisions.md "storage init": a crash leaves a file without a registry row, never a
    registered storage without its file; the next ``storage init PATH`` registers that identity."""
    vol = tmp_path / "vol"
    env = orbit_env(sqlite_url, ORBIT_FAILPOINTS="storage.init.before_commit=exit")
    crashed = run_orbit(["storage", "init", str(vol), "--create", "--label", "a"], env)
    assert crashed.returncode == 137, crashed.stderr
    ident = read_identity(vol)
    assert _storages(sqlite_url) == 0
    assert sorted(os.listdir(vol)) == [IDENTITY_FILE]
    refused = run_orbit(["storage", "init", str(vol), "--label", "b"], orbit_env(sqlite_url))
    assert_one_line_error(refused, 3, ident.storage_id.hex(), "'a'")
    adopted = run_orbit(["storage", "init", str(vol)], orbit_env(sqlite_url))
    assert adopted.returncode == 0 and adopted.stdout.strip() == ident.storage_id.hex()
    assert _storages(sqlite_url) == 1


@pytest.mark.mariadb
def test_commit_lost_keeps_the_file_and_says_how_to_finish(tmp_path: Path) -> None:
    """The database dies between the identity file and the commit: the commit's outcome is unknown,
    so the file stays (removing it could orphan a committed row) and the line says what to run."""
    with mariadb_database() as url, migrated_engine(url, "platform"):
        vol = tmp_path / "vol"
        marker = tmp_path / "stopped"
        env = orbit_env(url, ORBIT_FAILPOINTS=f"storage.init.before_commit=stop:{marker}")
        proc = subprocess.Popen(
            [str(ORBIT), "storage", "init", str(vol), "--create"],
            env=env,
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the failpoint was never reached"
                time.sleep(0.05)
            _kill_connections(url.rsplit("/", 1)[1])
            os.kill(proc.pid, signal.SIGCONT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        ident = read_identity(vol)
        assert_one_line_error(done, 1, str(vol), ident.storage_id.hex(), "orbit storage init")
        rerun = run_orbit(["storage", "init", str(vol), "--json"], orbit_env(url))
        assert rerun.returncode == 0, rerun.stderr
        assert _storages(url) == 1


def _kill_connections(database: str) -> None:
    admin = server_engine()
    try:
        with admin.connect() as conn:
            ids = conn.execute(
                text("SELECT id FROM information_schema.processlist WHERE db = :db"),
                {"db": database},
            ).scalars()
            for conn_id in list(ids):
                conn.execute(text(f"KILL {int(conn_id)}"))
    finally:
        admin.dispose()


@pytest.mark.parametrize("point", ["volume.before_publish", "volume.before_dir_fsync"])
def test_io_error_inside_the_identity_write_leaves_no_temp_file(
    point: str, sqlite_url: str, tmp_path: Path
) -> None:
    vol = tmp_path / "new" / "vol"
    env = orbit_env(sqlite_url, ORBIT_FAILPOINTS=f"{point}=oserror:EIO")
    proc = run_orbit(["storage", "init", str(vol), "--create"], env)
    line = assert_one_line_error(proc, 1, str(vol), "EIO")
    assert _storages(sqlite_url) == 0
    if point == "volume.before_publish":  # nothing was published: nothing is left
        assert not (tmp_path / "new").exists(), line
    else:  # published, not registered: the file alone, which a rerun adopts (and says so)
        assert sorted(os.listdir(vol)) == [IDENTITY_FILE]
        assert "orbit storage init" in line
        rerun = run_orbit(["storage", "init", str(vol)], orbit_env(sqlite_url))
        assert rerun.returncode == 0 and _storages(sqlite_url) == 1


# --------------------------------------------------------------------------- missing tables


@pytest.fixture(params=["sqlite", "mariadb"])
def empty_urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(platform URL, business URL) of two databases without any table."""
    if request.param == "sqlite":
        for name in ("p.sqlite3", "b.sqlite3"):  # the files exist, the tables do not
            sqlite3.connect(tmp_path / name).close()
        yield f"sqlite:///{tmp_path / 'p.sqlite3'}", f"sqlite:///{tmp_path / 'b.sqlite3'}"
    else:
        with mariadb_database() as platform, mariadb_database("orbit_b") as business:
            yield platform, business


def test_missing_tables_name_the_upgrade_to_run(
    empty_urls: tuple[str, str], tmp_path: Path
) -> None:
    platform, business = empty_urls
    env = orbit_env(platform, business)
    for args in (["namespace", "list"], ["job", "list", "acme"], ["plan", "list"]):
        proc = run_orbit(args, env)
        line = assert_one_line_error(proc, 1, "`orbit db upgrade`", "orbit_")
        assert "sender db upgrade" not in line
    vol = tmp_path / "vol"
    proc = run_orbit(["storage", "init", str(vol), "--create"], env)
    assert_one_line_error(proc, 1, "orbit_archive_storages", "`orbit db upgrade`")
    assert not vol.exists()
    proc = run_orbit(["sender", "list"], env)
    assert_one_line_error(proc, 1, "sender_outbox", "`orbit sender db upgrade`")


def test_schema_of_one_database_does_not_hide_the_other(sqlite_url: str, tmp_path: Path) -> None:
    """Platform migrated, business empty: only the business hint."""
    env = orbit_env(sqlite_url, f"sqlite:///{tmp_path / 'b.sqlite3'}")
    assert run_orbit(["namespace", "list"], env).returncode == 0
    proc = run_orbit(["sender", "list"], env)
    line = assert_one_line_error(proc, 1, "`orbit sender db upgrade`")
    assert "`orbit db upgrade`" not in line


def test_bad_log_level_is_bad_input(sqlite_url: str) -> None:
    proc = run_orbit(["namespace", "list"], orbit_env(sqlite_url, ORBIT_LOG_LEVEL="LOUD"))
    assert_one_line_error(proc, 2, "ORBIT_LOG_LEVEL", "'LOUD'", "DEBUG")


def test_demo_refuses_to_empty_a_directory_it_did_not_make(tmp_path: Path) -> None:
    """``orbit demo --dir D`` empties D first: only when D is empty or an earlier demo's."""
    precious = tmp_path / "volume"
    precious.mkdir()
    (precious / "keep.jsonl.gz").write_bytes(b"archived years ago")
    proc = run_orbit(["demo", "--dir", str(precious)], orbit_env("sqlite:///unused.sqlite3"))
    assert_one_line_error(proc, 2, str(precious), ".orbit-demo")
    assert (precious / "keep.jsonl.gz").read_bytes() == b"archived years ago"


def test_demo_directory_of_an_earlier_demo_is_emptied(tmp_path: Path) -> None:
    from orbit_tasks.dev.demo import DEMO_MARKER, prepare_dir

    fresh = tmp_path / "a" / "demo"
    prepare_dir(fresh)
    assert sorted(os.listdir(fresh)) == [DEMO_MARKER]
    (fresh / "platform.sqlite3").write_bytes(b"old run")
    prepare_dir(fresh)  # an earlier demo's directory: emptied
    assert sorted(os.listdir(fresh)) == [DEMO_MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_dir(empty)
    assert sorted(os.listdir(empty)) == [DEMO_MARKER]


def test_a_missing_sqlite_file_is_not_created_by_a_read(tmp_path: Path) -> None:
    """Only `db upgrade` creates the embedded database file; a read names the upgrade to run and
    leaves no empty file (or folder) behind."""
    db = tmp_path / "var" / "platform.sqlite3"
    biz = tmp_path / "var" / "business.sqlite3"
    env = {
        **os.environ,
        "ORBIT_DATABASE_URL": f"sqlite:///{db}",
        "ORBIT_SENDER_DATABASE_URL": f"sqlite:///{biz}",
        "ORBIT_VAR_DIR": str(tmp_path / "var"),
    }
    for args, fix in (
        (["namespace", "list"], "orbit db upgrade"),
        (["db", "check"], "orbit db upgrade"),
        (["sender", "list"], "orbit sender db upgrade"),
    ):
        proc = subprocess.run([ORBIT, *args], env=env, capture_output=True, text=True)
        assert proc.returncode == 1, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "does not exist" in lines[0] and f"`{fix}`" in lines[0], lines
        assert not db.exists() and not biz.exists(), args
    up = subprocess.run([ORBIT, "db", "upgrade"], env=env, capture_output=True, text=True)
    assert up.returncode == 0 and db.exists(), up.stderr
    listed = subprocess.run([ORBIT, "namespace", "list"], env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
