"""The volume identity file on real files: concurrent ``storage init`` runs on one path."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from orbit_tasks.archive.engine.volume import IDENTITY_FILE, read_identity, write_identity
from orbit_tasks.errors import ConflictError
from orbit_tasks.ids import new_id


def _race(root: Path, ids: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    won: list[bytes] = []
    refused: list[bytes] = []
    barrier = threading.Barrier(len(ids))

    def init(storage_id: bytes) -> None:
        barrier.wait()
        try:
            write_identity(root, storage_id, "race")
            won.append(storage_id)
        except ConflictError:
            refused.append(storage_id)

    threads = [threading.Thread(target=init, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def test_concurrent_identity_writes_have_exactly_one_winner(tmp_path: Path) -> None:
    for attempt in range(20):
        root = tmp_path / f"vol{attempt}"
        ids = [new_id() for _ in range(6)]
        won, refused = _race(root, ids)
        assert len(won) == 1 and len(refused) == len(ids) - 1
        assert read_identity(root).storage_id == won[0]
        assert sorted(p.name for p in root.iterdir()) == [IDENTITY_FILE]  # no temp files left


def test_same_identity_again_is_idempotent_and_other_is_refused(tmp_path: Path) -> None:
    sid = new_id()
    first = write_identity(tmp_path, sid, "a")
    before = (tmp_path / IDENTITY_FILE).read_bytes()
    assert write_identity(tmp_path, sid, "a").storage_id == first.storage_id
    with pytest.raises(ConflictError, match=sid.hex()):
        write_identity(tmp_path, new_id(), "b")
    assert (tmp_path / IDENTITY_FILE).read_bytes() == before
