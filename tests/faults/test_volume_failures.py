"""Failure paths of the durable writes in ``archive/volume.py`` on real files: a failed write leaves
no temp file, whatever step failed (write on a full disk, open on a read-only disk, publish, the
directory sync). Failures inside the steps come from the project's failpoints
(``ORBIT_FAILPOINTS="volume.before_publish=oserror:EIO"``), the same switch the fault tests use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbit_tasks.archive.engine import volume as vol
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.format import values as fv
from orbit_tasks.errors import InvalidInput
from orbit_tasks.failpoints import ENV as FAILPOINTS
from orbit_tasks.ids import new_id
from tests.support.fs import full_tmpfs, small_tmpfs


def _blob(seq: int, size: int = 100) -> tuple[str, bytes]:
    data = os.urandom(size)
    return file_names.batch_name(seq, fv.sha256_hex(data)), data


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    with full_tmpfs(tmp_path / "full") as mnt:
        yield mnt


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "ro", "64k", read_only=True) as mnt:
        yield mnt


# --------------------------------------------------------------------------- identity file


def test_identity_on_a_full_disk_leaves_nothing(full_disk: Path) -> None:
    for root in (full_disk, full_disk / "a" / "b"):
        with pytest.raises(vol.DiskFull, match="no space"):
            vol.write_identity(root, new_id(), "x")
        assert _tree(full_disk) == ["filler"]  # no temp file, no directory created on the way


def test_identity_on_a_read_only_disk_is_bad_input(read_only: Path) -> None:
    for root in (read_only, read_only / "vol"):
        with pytest.raises(InvalidInput, match="read-only"):
            vol.write_identity(root, new_id(), "x")
        assert _tree(read_only) == []


@pytest.mark.parametrize("code", ["EIO", "ENOSPC"])
def test_identity_failure_before_publish_leaves_nothing(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAILPOINTS, f"volume.before_publish=oserror:{code}")
    root = tmp_path / "x" / "vol"
    expected = vol.DiskFull if code == "ENOSPC" else vol.ArchiveIOError
    with pytest.raises(expected, match=code):
        vol.write_identity(root, new_id(), "x")
    assert _tree(tmp_path) == []


def test_identity_failure_after_publish_keeps_the_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once published the name stays (another ``storage init`` may already have read it); the
    error says that a rerun registers it. The temp file is gone either way."""
    monkeypatch.setenv(FAILPOINTS, "volume.before_dir_fsync=oserror:EIO")
    sid = new_id()
    with pytest.raises(vol.ArchiveIOError, match="orbit storage init"):
        vol.write_identity(tmp_path / "vol", sid, "x")
    assert _tree(tmp_path) == ["vol", f"vol/{vol.IDENTITY_FILE}"]
    monkeypatch.delenv(FAILPOINTS)
    assert vol.read_identity(tmp_path / "vol").storage_id == sid


def test_identity_write_creates_and_syncs_missing_directories(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "vol"
    ident = vol.write_identity(root, new_id(), "x")
    assert ident.path == root.resolve() and _tree(tmp_path) == [
        "a",
        "a/b",
        "a/b/vol",
        f"a/b/vol/{vol.IDENTITY_FILE}",
    ]


# --------------------------------------------------------------------------- chain files


@pytest.mark.parametrize("code", ["EIO", "ENOSPC"])
def test_chain_file_failure_before_publish_leaves_no_temp_file(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAILPOINTS, f"volume.before_publish=oserror:{code}")
    name, data = _blob(1)
    expected = vol.DiskFull if code == "ENOSPC" else vol.ArchiveIOError
    with pytest.raises(expected, match=code):
        vol.store_job_file(tmp_path / "job", name, data)
    assert os.listdir(tmp_path / "job") == []


def test_chain_file_failure_after_publish_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The published name stays: removing it here could delete a file that a live claim has
    adopted and confirmed meanwhile; the lease-checked cleanup of the next claim removes it."""
    monkeypatch.setenv(FAILPOINTS, "volume.before_dir_fsync=oserror:EIO")
    name, data = _blob(1)
    with pytest.raises(vol.ArchiveIOError, match="EIO"):
        vol.store_job_file(tmp_path / "job", name, data)
    assert os.listdir(tmp_path / "job") == [name]


def test_chain_file_on_a_read_only_disk_leaves_nothing(read_only: Path) -> None:
    name, data = _blob(1)
    with pytest.raises(vol.ArchiveIOError, match="EROFS"):
        vol.store_job_file(read_only / "job", name, data)
    assert _tree(read_only) == []


# --------------------------------------------------------------------------- inode-fenced removal


def test_removal_that_fails_after_setting_the_name_aside_puts_the_file_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale writer's removal renames the name to a ``.tmp-`` name before it checks the inode.
    If anything fails there, the file (maybe the live owner's, maybe confirmed) must be back
    under its name: a ``.tmp-`` name is what the next claim's cleanup deletes."""
    name, data = _blob(1)
    stored = vol.store_job_file(tmp_path / "job", name, data)
    monkeypatch.setenv(FAILPOINTS, "volume.after_aside=oserror:EIO")
    with pytest.raises(vol.ArchiveIOError, match="EIO"):
        vol.remove_file_if_unconfirmed(tmp_path / "job", name, (), inode=stored.inode + 1)
    assert os.listdir(tmp_path / "job") == [name]
    assert (tmp_path / "job" / name).read_bytes() == data
