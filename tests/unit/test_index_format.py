"""The id index files (issue 28 item 1, orbit_tasks/archive/format/index.py): deterministic
bytes, a binary search that finds every id and no other, and refusals naming the file."""

from __future__ import annotations

import os

import pytest

from orbit_tasks.archive.format import index as fmt
from orbit_tasks.archive.format.names import batch_name, manifest_name
from orbit_tasks.archive.format.values import sha256_hex

JOB = bytes(range(16))


def _records(ids: list[bytes]) -> list[bytes]:
    return [fmt.ENTRY.pack(rid, 1 + n // 3, 1 + n % 3) for n, rid in enumerate(ids)]


def test_a_shard_finds_each_of_its_ids_and_no_other() -> None:
    ids = sorted({b"\x7f" + os.urandom(15) for _ in range(500)}, reverse=True)
    name, data = fmt.build_shard(JOB, 0x7F, _records(ids))
    assert (name, data) == fmt.build_shard(JOB, 0x7F, list(reversed(_records(ids))))
    assert name == f"shard-7f-{sha256_hex(data)}.bin"
    for n, rid in enumerate(ids):
        found = fmt.find_in_shard(name, data, job_id=JOB.hex(), shard=0x7F, entries=len(ids),
                                  root_id=rid)  # fmt: skip
        assert found == fmt.Entry(rid, 1 + n // 3, 1 + n % 3)
    other = b"\x7f" + os.urandom(15)
    assert (
        other in ids
        or fmt.find_in_shard(
            name, data, job_id=JOB.hex(), shard=0x7F, entries=len(ids), root_id=other
        )
        is None
    )
    bad = data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(fmt.IndexInvalid, match=name):
        fmt.find_in_shard(name, bad, job_id=JOB.hex(), shard=0x7F, entries=len(ids), root_id=other)
    with pytest.raises(fmt.IndexInvalid, match="entries differ"):
        fmt.find_in_shard(name, data, job_id=JOB.hex(), shard=0x7F, entries=3, root_id=other)


def test_a_shard_refuses_a_repeated_id_or_a_foreign_one() -> None:
    rid = b"\x01" * 16
    with pytest.raises(Exception, match="twice"):
        fmt.build_shard(JOB, 1, [fmt.ENTRY.pack(rid, 1, 1), fmt.ENTRY.pack(rid, 2, 1)])
    with pytest.raises(Exception, match="wrong shard"):
        fmt.build_shard(JOB, 2, [fmt.ENTRY.pack(rid, 1, 1)])


def test_the_top_is_checked_against_its_recorded_hash_and_its_last_link() -> None:
    shas = [sha256_hex(bytes([n])) for n in range(3)]
    spans = [
        fmt.BatchSpan(batch_name(seq, shas[seq]), 2, ("2026-01-01T00:00:00.000000Z", "aa" * 16),
                      ("2026-01-02T00:00:00.000000Z", "bb" * 16))
        for seq in (1, 2)
    ]  # fmt: skip
    shards = {0xAA: ("shard-aa-" + "0" * 64 + ".bin", 4)}
    args = dict(namespace_id=JOB, job_id=JOB, kind="tasks", storage_id=JOB,
                manifest=manifest_name(shas[0]), spans=spans, shards=shards)  # fmt: skip
    name, data = fmt.build_top(**args)  # type: ignore[arg-type]
    assert (name, data) == fmt.build_top(**args)  # type: ignore[arg-type]
    top = fmt.parse_top(data, sha256_hex(data))
    assert (top.batches, top.roots, top.last_sha256) == (2, 4, shas[2])
    assert top.link(0) == shas[0] and top.link(1) == shas[1] and top.span(2) == spans[1]
    with pytest.raises(fmt.IndexInvalid, match="recorded"):
        fmt.parse_top(data.replace(b'"roots":4', b'"roots":5'), sha256_hex(data))
