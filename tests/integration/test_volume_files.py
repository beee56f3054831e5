"""Job files on a real filesystem: durable publish, no overwrite, cleanup, zcat, ENOSPC, verify."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbit_tasks.archive.engine import volume as vol
from orbit_tasks.archive.engine.verify import (
    ChainInvalid,
    export_roots,
    verify_job_dir,
    verify_job_prefix,
)
from orbit_tasks.archive.format import batch as ff
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.format.expectation import ChainExpectation
from tests.support.archive_chain import JOB, NS, Chain, build_chain, rid, with_expect
from tests.support.fs import small_tmpfs as mount_small_tmpfs


def _write_chain(directory: Path, chain: Chain) -> None:
    for name, data in chain.files:
        vol.write_job_file(directory, name, data)


def _blob(seq: int, size: int = 1000) -> tuple[str, bytes]:
    data = os.urandom(size)
    return file_names.batch_name(seq, fv.sha256_hex(data)), data


def test_write_job_file_publishes_durably(tmp_path: Path) -> None:
    directory = vol.job_dir(tmp_path, NS, JOB)  # <volume>/<ns>/<job>, created on demand
    name, data = _blob(1)
    stored = vol.store_job_file(directory, name, data)
    assert stored.created and stored.path == directory / name
    assert stored.path.read_bytes() == data
    assert os.stat(stored.path).st_ino == stored.inode
    assert sorted(os.listdir(directory)) == [name]  # no temp file left behind
    assert os.listdir(tmp_path) == [NS.hex()]
    again = vol.store_job_file(directory, name, data)
    assert not again.created and again.inode == stored.inode  # left untouched
    assert vol.write_job_file(directory, name, data) == directory / name
    assert sorted(os.listdir(directory)) == [name]


def test_existing_name_is_never_overwritten(tmp_path: Path) -> None:
    name, data = _blob(2)
    path = tmp_path / name
    path.write_bytes(b"something else")  # e.g. a corrupted file under the confirmed name
    with pytest.raises(vol.FileConflict):
        vol.write_job_file(tmp_path, name, data)
    assert path.read_bytes() == b"something else"
    other = os.urandom(10)
    with pytest.raises(ValueError):
        vol.write_job_file(tmp_path, name, other)  # bytes that do not match the name
    with pytest.raises(ValueError):
        vol.write_job_file(tmp_path, "notes.txt", other)
    assert path.read_bytes() == b"something else"
    assert sorted(os.listdir(tmp_path)) == [name]


def test_io_error_maps_to_archive_io_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    name, data = _blob(1)
    with pytest.raises(vol.ArchiveIOError) as err:
        vol.write_job_file(blocker / "job", name, data)
    assert not isinstance(err.value, vol.DiskFull)
    assert "ENOTDIR" in str(err.value) and data.hex()[:16] not in str(err.value)


def test_list_and_remove_beyond_prefix(tmp_path: Path) -> None:
    chain = build_chain()
    _write_chain(tmp_path, chain)
    dup_name, dup = _blob(1)
    (tmp_path / dup_name).write_bytes(dup)  # a stray duplicate at the tail position
    (tmp_path / ".tmp-00000004-x.jsonl.gz.1.ab").write_bytes(b"half")
    (tmp_path / "README").write_bytes(b"operator note")
    listed = vol.list_job_files(tmp_path)
    assert [p.seq for _, p in listed] == [0, 1, 1, 2, 3]
    assert all(not n.startswith(".tmp-") for n, _ in listed)
    removed = vol.remove_beyond_prefix(tmp_path, 1, last_sha256=chain.name(1)[9:73])
    assert sorted(removed) == sorted(
        [chain.name(2), chain.name(3), dup_name, ".tmp-00000004-x.jsonl.gz.1.ab"]
    )
    assert sorted(os.listdir(tmp_path)) == sorted([chain.name(0), chain.name(1), "README"])
    assert vol.remove_beyond_prefix(tmp_path, 1) == []
    assert sorted(vol.remove_beyond_prefix(tmp_path, 0, last_sha256="")) == sorted(
        [chain.name(0), chain.name(1)]
    )
    assert os.listdir(tmp_path) == ["README"]
    assert vol.remove_beyond_prefix(tmp_path / "absent", 0) == []
    assert vol.list_job_files(tmp_path / "absent") == []


def test_remove_file_if_unconfirmed_is_inode_fenced(tmp_path: Path) -> None:
    name, data = _blob(3)
    mine = vol.store_job_file(tmp_path, name, data)
    assert not vol.remove_file_if_unconfirmed(tmp_path, name, {name}, inode=mine.inode)
    assert (tmp_path / name).exists()
    # The new owner removed our leftover and re-wrote the same name: never delete its file.
    keep = tmp_path.parent / f"{tmp_path.name}-keep"
    os.link(tmp_path / name, keep)  # keeps our inode allocated so its number is not reused
    (tmp_path / name).unlink()
    theirs = vol.store_job_file(tmp_path, name, data)
    assert theirs.created and theirs.inode != mine.inode
    assert not vol.remove_file_if_unconfirmed(tmp_path, name, set(), inode=mine.inode)
    assert os.stat(tmp_path / name).st_ino == theirs.inode  # put back, same file
    assert (tmp_path / name).read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == [name]
    keep.unlink()
    assert vol.remove_file_if_unconfirmed(tmp_path, name, set(), inode=theirs.inode)
    assert not (tmp_path / name).exists()
    assert not vol.remove_file_if_unconfirmed(tmp_path, name, set(), inode=theirs.inode)
    vol.write_job_file(tmp_path, name, data)
    assert vol.remove_file_if_unconfirmed(tmp_path, name, set())
    assert os.listdir(tmp_path) == []


def test_zcat_reads_a_batch(tmp_path: Path) -> None:
    zcat = shutil.which("zcat")
    assert zcat is not None, "zcat (Debian's essential gzip package) must be on the machine"
    chain = build_chain()
    _write_chain(tmp_path, chain)
    out = subprocess.run(
        [zcat, str(tmp_path / chain.name(2))], check=True, capture_output=True, timeout=30
    )
    assert out.stdout == gzip.decompress(chain.data(2))
    assert out.stdout.split(b"\n")[0].startswith(b'{"final":false,"first":[')


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mount_small_tmpfs(tmp_path / "small", "64k") as mnt:
        yield mnt


def test_disk_full_raises_and_leaves_no_partial_file(small_tmpfs: Path) -> None:
    directory = small_tmpfs / "ns" / "job"
    written: list[str] = []
    with pytest.raises(vol.DiskFull):
        for seq in range(1, 40):
            name, data = _blob(seq, 16 * 1024)
            vol.write_job_file(directory, name, data)
            written.append(name)
    assert written  # some files fit before the volume filled up
    names = sorted(os.listdir(directory))
    assert names == sorted(written)  # no temp file, no partial final file
    for name in names:
        assert fv.sha256_hex((directory / name).read_bytes()) == file_names.parse_name(name).sha256  # type: ignore[union-attr]


def test_group_is_published_in_chain_order_with_no_temp_file(tmp_path: Path) -> None:
    directory = tmp_path / "ns" / "job"
    group = [_blob(seq, 50_000) for seq in range(1, 5)]
    stored, error = vol.store_job_files(directory, group)
    assert error is None
    assert [s.path.name for s in stored] == [name for name, _ in group]
    assert all(s.created for s in stored)
    assert sorted(os.listdir(directory)) == sorted(name for name, _ in group)
    for (name, data), s in zip(group, stored, strict=True):
        assert (directory / name).read_bytes() == data
        assert os.stat(directory / name).st_ino == s.inode


def test_group_stops_at_its_first_failure_and_removes_the_later_temp_files(tmp_path: Path) -> None:
    """The temp files are written in parallel: those after the failed file (written, synced)
    are removed, never published; the files before it are stored."""
    directory = tmp_path / "job"
    group = [_blob(seq) for seq in range(1, 5)]
    directory.mkdir()
    (directory / group[1][0]).write_bytes(b"other bytes")
    stored, error = vol.store_job_files(directory, group)
    assert isinstance(error, vol.FileConflict)
    assert [s.path.name for s in stored] == [group[0][0]]
    assert sorted(os.listdir(directory)) == sorted([group[0][0], group[1][0]])
    assert (directory / group[1][0]).read_bytes() == b"other bytes"


def test_group_on_a_full_disk_stores_a_prefix_and_leaves_no_temp_file(small_tmpfs: Path) -> None:
    directory = small_tmpfs / "ns" / "job"
    group = [_blob(seq, 20 * 1024) for seq in range(1, 5)]  # 80 KiB on a 64 KiB volume
    stored, error = vol.store_job_files(directory, group)
    assert isinstance(error, vol.DiskFull)
    names = [s.path.name for s in stored]
    assert names == [name for name, _ in group[: len(names)]]  # a prefix, in chain order
    assert sorted(os.listdir(directory)) == sorted(names)


# --------------------------------------------------------------------------- verify / export


def test_verify_job_dir_and_export(tmp_path: Path) -> None:
    chain = build_chain()
    directory = tmp_path / "job"
    _write_chain(directory, chain)
    (directory / ".tmp-00000004-zz.jsonl.gz.1.ab").write_bytes(b"in flight")  # ignored
    report = verify_job_dir(directory, chain.expect)
    assert report.ok and report.roots == 5 and report.bytes == chain.expect.bytes
    lines = list(export_roots(directory, chain.expect))
    assert [ln["root"]["id"] for ln in lines] == [rid(i).hex() for i in range(1, 6)]
    assert lines[0]["root"]["request_json"] == (
        '{"amount":1.10,"big":12345678901234567890.000,"n":"\U0001f600"}'
    )
    assert lines[0]["children"]["orbit_task_attempts"][0]["task_id"] == rid(1).hex()
    prefix = verify_job_prefix(directory, chain.expect)
    assert prefix.ok and prefix.cursor is not None and prefix.cursor[1] == rid(5)
    assert verify_job_prefix(directory, chain.expect, full=True).ok


def test_verify_job_dir_names_missing_and_bad_files(tmp_path: Path) -> None:
    chain = build_chain()
    missing = verify_job_dir(tmp_path / "nope", chain.expect)
    assert not missing.ok and missing.first_bad_file == str(tmp_path / "nope")
    nothing = with_expect(chain, batches=0, roots=0, bytes=0, last_sha256="", complete=False)
    assert verify_job_dir(tmp_path / "nope", nothing).ok
    directory = tmp_path / "job"
    _write_chain(directory, chain)
    (directory / chain.name(2)).unlink()
    report = verify_job_dir(directory, chain.expect)
    assert not report.ok and report.first_bad_file == chain.name(2)
    with pytest.raises(ChainInvalid, match=chain.name(2)):
        list(export_roots(directory, chain.expect))
    (directory / chain.name(2)).write_bytes(chain.data(3))  # wrong content under the name
    report = verify_job_dir(directory, chain.expect)
    assert not report.ok and report.first_bad_file == chain.name(2)
    (directory / chain.name(2)).unlink()
    (directory / chain.name(2)).mkdir()  # unreadable as a file: reported by name, no exception
    report = verify_job_dir(directory, chain.expect)
    assert not report.ok and report.first_bad_file == chain.name(2)
    assert "cannot be read" in (report.reason or "")
    (directory / chain.name(2)).rmdir()
    (directory / chain.name(2)).write_bytes(chain.data(2))
    assert verify_job_dir(directory, chain.expect).ok
    (directory / "stray.bin").write_bytes(b"x")
    report = verify_job_dir(directory, chain.expect)
    assert not report.ok and report.first_bad_file == "stray.bin"


# --------------------------------------------------------------------------- real database values


@pytest.mark.mariadb
def test_database_rows_encode_exactly(any_platform_url: str, tmp_path: Path) -> None:
    """Values as the drivers return them (mysqlclient, sqlite3) encode exactly, 4-byte UTF-8 and
    exact JSON numbers included, and the written chain verifies from disk."""
    from datetime import datetime

    from sqlalchemy import select

    from orbit_tasks.db import history_tables as h
    from orbit_tasks.db.engine import make_engine
    from tests.support.archive_chain import STORAGE, manifest

    body = '{"amount":1.10,"big":123456789012345678901234567890,"emoji":"\U0001f600\u2028"}'
    t_end = datetime(2026, 3, 1, 12, 0, 0, 999999)
    task = {
        "namespace_id": NS, "id": rid(1), "queue_id": rid(9), "state": "SUCCEEDED",
        "idempotency_key": "op-~ascii only!", "request_json": body, "result_json": None,
        "error_code": "", "attempts": 2**32 - 1, "created_at": datetime(2026, 3, 1),
        "started_at": datetime(2026, 3, 1, 0, 0, 0, 1), "finished_at": t_end,
    }  # fmt: skip
    attempt = {
        "namespace_id": NS, "task_id": rid(1), "attempt_no": 1, "state": "DONE",
        "worker": "w\U0001f916", "error_code": "", "started_at": datetime(2026, 3, 1),
        "finished_at": None,
    }  # fmt: skip
    engine = make_engine(any_platform_url)
    try:
        with engine.begin() as conn:
            conn.execute(h.tasks.insert().values(**task))
            conn.execute(h.task_attempts.insert().values(**attempt))
        with engine.connect() as conn:
            root = dict(conn.execute(select(h.tasks)).mappings().one())
            kids = [dict(r) for r in conn.execute(select(h.task_attempts)).mappings()]
    finally:
        engine.dispose()
    assert root == task and kids == [attempt]  # the drivers hand back exactly what was stored
    man = manifest(roots_total=1)
    data = ff.build_batch(
        job_id=JOB,
        seq=1,
        prev_sha256=fv.sha256_hex(man),
        records=[ff.RootRecord(root, {"orbit_task_attempts": kids})],
        settled_column="finished_at",
        final=True,
    )
    directory = vol.job_dir(tmp_path, NS, JOB)
    vol.write_job_file(directory, file_names.manifest_name(fv.sha256_hex(man)), man)
    vol.write_job_file(directory, file_names.batch_name(1, fv.sha256_hex(data)), data)
    expect = ChainExpectation(
        namespace_id=NS, job_id=JOB, kind="tasks", storage_id=STORAGE, batch_size=2,
        plan_revision=3, policy_revision=2, batches=1, roots=1, bytes=len(man) + len(data),
        last_sha256=fv.sha256_hex(data), complete=True,
    )  # fmt: skip
    [line] = list(export_roots(directory, expect))
    assert line["root"]["request_json"] == body
    assert line["root"]["attempts"] == 4294967295
    assert line["root"]["finished_at"] == "2026-03-01T12:00:00.999999Z"
    assert line["root"]["started_at"] == "2026-03-01T00:00:00.000001Z"
    assert line["root"]["idempotency_key"] == "op-~ascii only!"
    assert line["children"]["orbit_task_attempts"][0]["worker"] == "w\U0001f916"
    assert line["children"]["orbit_task_attempts"][0]["finished_at"] is None
    assert "\U0001f600".encode() in gzip.decompress(data)  # raw 4-byte UTF-8 in the file
