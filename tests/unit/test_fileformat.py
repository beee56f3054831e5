"""orbit-archive/1: encoding, deterministic gzip, names, manifest/batch decoding, chain checks."""

from __future__ import annotations

import gzip
import io
import json
import struct
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from orbit_tasks.archive.format import batch as ff
from orbit_tasks.archive.format import manifest as fm
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.format import values as fv
from orbit_tasks.archive.format.chain import verify_chain, verify_chain_part, verify_prefix
from orbit_tasks.archive.format.expectation import ChainExpectation, VerifyReport
from orbit_tasks.archive.format.gzip_member import gzip_member
from tests.support.archive_chain import (
    JOB,
    NS,
    STORAGE,
    T0,
    UNTIL,
    build_chain,
    manifest,
    record,
    rid,
    with_expect,
)

SPEC_MANIFEST_KEYS = {
    "format",
    "namespace_id",
    "job_id",
    "kind",
    "plan_revision",
    "policy_revision",
    "storage_id",
    "batch_size",
    "range",
    "roots_total",
    "source",
    "created_at",
}

# --------------------------------------------------------------------------- values


def test_canonical_json_exact_bytes() -> None:
    out = fv.canonical_json({"b": [1, {"z": None, "a": True}], "a": "x y", "\u00e9": "\U0001f600"})
    assert out == ('{"a":"x y","b":[1,{"a":true,"z":null}],"\u00e9":"\U0001f600"}\n'.encode())
    assert b"\xf0\x9f\x98\x80" in out  # 4-byte UTF-8 kept raw, not \\ud83d escapes
    assert out.endswith(b"}\n") and out.count(b"\n") == 1


def test_canonical_json_rejects_float_nan_and_surrogates() -> None:
    with pytest.raises(fv.SourceInvalid):
        fv.canonical_json({"x": float("nan")})
    with pytest.raises(fv.SourceInvalid):
        fv.canonical_json({"x": "\ud800"})


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (b"\x00\xab\xff", "00abff"),
        (bytearray(b"\x01\x02"), "0102"),
        (memoryview(b"\x10"), "10"),
        (datetime(2026, 1, 2, 3, 4, 5, 0), "2026-01-02T03:04:05.000000Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 999999), "2026-01-02T03:04:05.999999Z"),
        (datetime(1, 1, 1), "0001-01-01T00:00:00.000000Z"),
        (
            datetime(2026, 1, 2, 5, 4, 5, 7, tzinfo=timezone(timedelta(hours=2))),
            "2026-01-02T03:04:05.000007Z",
        ),
        (None, None),
        (0, 0),
        (2**64 - 1, 18446744073709551615),
        (-5, -5),
        (True, True),
        (False, False),
        ("caf\u00e9 \U0001f600", "caf\u00e9 \U0001f600"),
        ('{"a":1.10}', '{"a":1.10}'),
    ],
)
def test_encode_value(value: object, encoded: object) -> None:
    out = fv.encode_value(value)
    assert out == encoded and type(out) is type(encoded)


@pytest.mark.parametrize(
    "value", [1.5, float("inf"), Decimal("1.10"), date(2026, 1, 1), "\udc80", object(), [1]]
)
def test_encode_value_rejects(value: object) -> None:
    with pytest.raises(fv.SourceInvalid):
        fv.encode_value(value)


def test_timestamps_round_trip_and_strict_parse() -> None:
    for dt in (datetime(2026, 2, 28, 23, 59, 59, 999999), datetime(2026, 3, 1), T0):
        assert fv.parse_ts(fv.format_ts(dt)) == dt
    assert fv.format_ts(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00.000000Z"
    for bad in (
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00.000000+00:00",
        "2026-02-30T00:00:00.000000Z",
        5,
    ):
        with pytest.raises(fv.FormatError):
            fv.parse_ts(bad)  # type: ignore[arg-type]


def test_exact_json_text_preserved_byte_for_byte() -> None:
    rec = record(1)
    text = rec.root["request_json"]
    data = ff.build_batch(
        job_id=JOB,
        seq=1,
        prev_sha256="0" * 64,
        records=[rec],
        settled_column="finished_at",
        final=True,
    )
    line = ff.decode_batch(data, settled_column="finished_at").lines[0]
    assert line["root"]["request_json"] == text  # 1.10 and the 20-digit number stay as written
    raw = gzip.decompress(data).split(b"\n")[1]
    assert b'\\"amount\\":1.10' in raw and "\U0001f600".encode() in raw


def test_unencodable_column_named_without_value() -> None:
    rec = record(1)
    bad = ff.RootRecord({**rec.root, "result_json": 0.1}, rec.children)
    with pytest.raises(fv.SourceInvalid, match=r"root\.result_json") as err:
        ff.build_batch(
            job_id=JOB,
            seq=1,
            prev_sha256="0" * 64,
            records=[bad],
            settled_column="finished_at",
            final=True,
        )
    assert "0.1" not in str(err.value)
    kid = dict(rec.children["orbit_task_attempts"][0], worker="\ud800")
    bad2 = ff.RootRecord(rec.root, {"orbit_task_attempts": [kid]})
    with pytest.raises(fv.SourceInvalid, match=r"orbit_task_attempts\.worker"):
        ff.build_batch(
            job_id=JOB,
            seq=1,
            prev_sha256="0" * 64,
            records=[bad2],
            settled_column="finished_at",
            final=True,
        )


# --------------------------------------------------------------------------- gzip and names


def _batch(**over: object) -> bytes:
    args: dict[str, object] = {
        "job_id": JOB,
        "seq": 1,
        "prev_sha256": "a" * 64,
        "records": [record(1), record(2, attempts=3)],
        "settled_column": "finished_at",
        "final": False,
    }
    args.update(over)
    return ff.build_batch(**args)  # type: ignore[arg-type]


def test_gzip_is_deterministic_and_standard() -> None:
    a, b = _batch(), _batch()
    assert a == b
    assert a[:2] == b"\x1f\x8b" and a[2] == 8
    assert a[3] == 0  # FLG: no FNAME, FCOMMENT, FEXTRA
    assert struct.unpack("<I", a[4:8])[0] == 0  # mtime 0
    payload = gzip.decompress(a)
    header = json.loads(payload.split(b"\n")[0])
    assert header == {
        "format": "orbit-archive/1",
        "job_id": JOB.hex(),
        "seq": 1,
        "prev_sha256": "a" * 64,
        "roots": 2,
        "first": ["2026-03-01T12:00:01.000000Z", rid(1).hex()],
        "last": ["2026-03-01T12:00:02.000000Z", rid(2).hex()],
        "final": False,
    }
    assert payload.endswith(b"\n") and payload.count(b"\n") == 3


def test_decode_rejects_gzip_with_name_mtime_or_trailing_bytes() -> None:
    payload = gzip.decompress(_batch())
    named = io.BytesIO()
    with gzip.GzipFile(filename="x.jsonl", mode="wb", fileobj=named, mtime=0) as fh:
        fh.write(payload)
    with pytest.raises(fv.FormatError, match="flags"):
        ff.decode_batch(named.getvalue())
    with pytest.raises(fv.FormatError, match="mtime"):
        ff.decode_batch(gzip.compress(payload, mtime=12345))
    with pytest.raises(fv.FormatError, match="trailing"):
        ff.decode_batch(_batch() + b"\x00")
    good = bytearray(_batch())
    good[-5] ^= 0xFF  # CRC/size trailer
    with pytest.raises(fv.FormatError):
        ff.decode_batch(bytes(good))


def test_line_splitting_only_on_newline() -> None:
    rec = record(1)
    odd = ff.RootRecord({**rec.root, "result_json": "a\u2028b\x1cc\x85d\ne\rf"}, rec.children)
    data = _batch(records=[odd, record(2)])
    lines = ff.decode_batch(data, settled_column="finished_at").lines
    assert len(lines) == 2 and lines[0]["root"]["result_json"] == "a\u2028b\x1cc\x85d\ne\rf"


def test_names() -> None:
    sha = "0123456789abcdef" * 4
    assert file_names.manifest_name(sha) == f"00000000-{sha}.json"
    assert file_names.batch_name(7, sha) == f"00000007-{sha}.jsonl.gz"
    assert file_names.parse_name(file_names.manifest_name(sha)) == file_names.ParsedName(
        0, sha, True
    )
    assert file_names.parse_name(file_names.batch_name(12345678, sha)) == file_names.ParsedName(
        12345678, sha, False
    )
    assert file_names.tail_name(0, sha) == file_names.manifest_name(sha)
    assert file_names.tail_name(3, sha) == file_names.batch_name(3, sha)
    for bad in (
        f".tmp-00000001-{sha}.jsonl.gz.12.ab",
        f"00000001-{sha}.json",  # batch seq with manifest extension
        f"00000000-{sha}.jsonl.gz",  # seq 0 is the manifest
        f"00000001-{sha.upper()}.jsonl.gz",
        f"0000001-{sha}.jsonl.gz",
        f"00000001-{sha[:-1]}.jsonl.gz",
        f"00000001-{sha}.jsonl.gz.bak",
        ".orbit-volume.json",
    ):
        assert file_names.parse_name(bad) is None, bad
    with pytest.raises(ValueError):
        file_names.batch_name(0, sha)
    with pytest.raises(ValueError):
        file_names.batch_name(100_000_000, sha)
    with pytest.raises(ValueError):
        file_names.manifest_name("XYZ")


# --------------------------------------------------------------------------- manifest and batch


def test_manifest_keys_exactly_spec() -> None:
    data = manifest(range_from=T0)
    doc = json.loads(data)
    assert set(doc) == SPEC_MANIFEST_KEYS
    assert doc["range"] == {
        "from": "2026-03-01T12:00:00.000000Z",
        "until": "2026-03-02T00:00:00.000000Z",
    }
    assert doc["format"] == "orbit-archive/2"
    src = doc["source"]
    assert (src["table"], src["settled_column"]) == ("orbit_tasks", "finished_at")
    assert [(c["table"], c["parent_column"]) for c in src["children"]] == [
        ("orbit_task_attempts", "task_id")
    ]  # the column descriptions: tests/unit/test_table_schema.py
    assert doc["namespace_id"] == NS.hex() and doc["storage_id"] == STORAGE.hex()
    assert fm.decode_manifest(data) == doc
    assert json.loads(manifest())["range"]["from"] is None
    assert data == fv.canonical_json(doc)


def test_decode_manifest_rejects() -> None:
    doc = json.loads(manifest())
    with pytest.raises(fv.FormatError, match="canonical"):
        fm.decode_manifest(json.dumps(doc, sort_keys=True).encode() + b"\n")  # spaces
    with pytest.raises(fv.FormatError, match="canonical"):
        fm.decode_manifest(fv.canonical_json(doc)[:-1])  # no trailing newline
    for mutate in (
        lambda d: d.pop("kind"),
        lambda d: d.update(extra=1),
        lambda d: d.update(format="orbit-archive/3"),
        lambda d: d.update(format="orbit-archive/1"),  # a format-1 manifest has no columns
        lambda d: d.update(job_id="XY"),
        lambda d: d.update(batch_size=0),
        lambda d: d.update(roots_total=-1),
        lambda d: d.update(range={"from": None}),
        lambda d: d.update(created_at="yesterday"),
        lambda d: d["source"].pop("children"),
    ):
        bad = json.loads(manifest())
        mutate(bad)
        with pytest.raises(fv.FormatError):
            fm.decode_manifest(fv.canonical_json(bad))
    with pytest.raises(fv.FormatError):
        fm.decode_manifest(b'{"x":1.5}\n')
    with pytest.raises(ValueError):
        manifest(storage_id=b"short")


def test_build_batch_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        _batch(records=[])
    with pytest.raises(ValueError, match="order"):
        _batch(records=[record(2), record(1)])
    with pytest.raises(ValueError, match="order"):
        _batch(records=[record(1), record(1)])
    unsettled = record(1)
    with pytest.raises(fv.SourceInvalid):
        _batch(records=[ff.RootRecord({**unsettled.root, "finished_at": None}, unsettled.children)])
    with pytest.raises(ValueError):
        _batch(records=[record(1), ff.RootRecord(record(2).root, {})])
    with pytest.raises(ValueError):
        _batch(prev_sha256="nothex")


def test_order_uses_settled_then_id() -> None:
    same = T0 + timedelta(seconds=9)
    data = _batch(
        records=[record(3, settled=same), record(2, settled=same + timedelta(microseconds=1))]
    )
    dec = ff.decode_batch(data, settled_column="finished_at")
    assert [ln["root"]["id"] for ln in dec.lines] == [rid(3).hex(), rid(2).hex()]
    assert ff.batch_cursor(dec.header) == (same + timedelta(microseconds=1), rid(2))


def test_decode_batch_checks_lines_against_header() -> None:
    payload = gzip.decompress(_batch())
    head, l1, l2, _ = payload.split(b"\n")

    def gz(p: bytes) -> bytes:
        return gzip_member(p)

    with pytest.raises(fv.FormatError, match="line count"):
        ff.decode_batch(gz(head + b"\n" + l1 + b"\n"))
    with pytest.raises(fv.FormatError, match="out of order"):
        ff.decode_batch(gz(head + b"\n" + l2 + b"\n" + l1 + b"\n"), settled_column="finished_at")
    h = json.loads(head)
    h["last"] = h["first"]
    swapped = fv.canonical_json(h) + l1 + b"\n" + l2 + b"\n"
    with pytest.raises(fv.FormatError):
        ff.decode_batch(gz(swapped), settled_column="finished_at")
    with pytest.raises(fv.FormatError, match="canonical"):
        ff.decode_batch(gz(head + b"\n" + l1 + b" \n" + l2 + b"\n"))


def test_decode_batch_ends_parses_only_the_first_and_last_line() -> None:
    """The runner's chain checks (``lines="ends"``) parse the first and the last line and count
    the others; ``orbit job verify`` (``"all"``) parses every line. A middle line no encoder of
    ours writes (not canonical) is what only the full check reports."""
    recs = [record(1), record(2), record(3)]
    payload = gzip.decompress(_batch(records=recs))
    head, l1, l2, l3, _ = payload.split(b"\n")
    odd = gzip_member(head + b"\n" + l1 + b"\n" + l2 + b" \n" + l3 + b"\n")
    ends = ff.decode_batch(odd, settled_column="finished_at", lines="ends")
    assert [ln["root"]["id"] for ln in ends.lines] == [rid(1).hex(), rid(3).hex()]
    with pytest.raises(fv.FormatError, match="canonical"):
        ff.decode_batch(odd, settled_column="finished_at")
    for bad in (  # what the ends check still catches
        head + b"\n" + l1 + b" \n" + l2 + b"\n" + l3 + b"\n",  # first line not canonical
        head + b"\n" + l1 + b"\n" + l2 + b"\n" + l3 + b" \n",  # last line not canonical
        head + b"\n" + l1 + b"\n\n" + l3 + b"\n",  # an empty line
        head + b"\n" + l1 + b"\n" + l3 + b"\n",  # a line missing
        head + b"\n" + l2 + b"\n" + l1 + b"\n" + l3 + b"\n",  # first line is not `first`
    ):
        with pytest.raises(fv.FormatError):
            ff.decode_batch(gzip_member(bad), settled_column="finished_at", lines="ends")
    single = _batch(records=[record(4)])
    assert len(ff.decode_batch(single, settled_column="finished_at", lines="ends").lines) == 1


# --------------------------------------------------------------------------- chain verification


def test_three_batch_chain_verifies_in_any_order() -> None:
    chain = build_chain()
    report = verify_chain(list(reversed(chain.files)), expect=chain.expect)
    assert report.ok, report
    assert (report.batches, report.roots, report.final) == (3, 5, True)
    assert report.bytes == chain.expect.bytes and report.last_sha256 == chain.expect.last_sha256
    assert report.cursor == (T0 + timedelta(seconds=5), rid(5))
    lazy = [(n, (lambda d=d: d)) for n, d in chain.files]
    assert verify_chain(lazy, expect=chain.expect).ok


def test_expectation_from_job_row() -> None:
    chain = build_chain()
    e = chain.expect
    row = {
        "namespace_id": NS, "id": JOB, "kind": "tasks", "storage_id": STORAGE, "batch_size": 2,
        "plan_revision": 3, "policy_revision": 2, "batches": e.batches, "roots": e.roots,
        "bytes": e.bytes, "last_sha256": e.last_sha256, "state": "SUCCEEDED",
    }  # fmt: skip
    assert ChainExpectation.from_job_row(row) == e
    assert not ChainExpectation.from_job_row({**row, "state": "RUNNING"}).complete


def test_empty_range_is_manifest_only() -> None:
    man = manifest(roots_total=0, range_from=UNTIL, range_until=UNTIL)
    sha = fv.sha256_hex(man)
    expect = ChainExpectation(
        namespace_id=NS, job_id=JOB, kind="tasks", storage_id=STORAGE, batch_size=2,
        plan_revision=3, policy_revision=2, batches=0, roots=0, bytes=len(man),
        last_sha256=sha, complete=True,
    )  # fmt: skip
    report = verify_chain([(file_names.manifest_name(sha), man)], expect=expect)
    assert report.ok and report.cursor is None and report.batches == 0
    bad = verify_chain([(file_names.manifest_name(sha), man)], expect=with_expect(expect, roots=1))
    assert not bad.ok
    man1 = manifest(roots_total=1)
    sha1 = fv.sha256_hex(man1)
    e1 = with_expect(expect, bytes=len(man1), last_sha256=sha1)
    r = verify_chain([(file_names.manifest_name(sha1), man1)], expect=e1)
    assert not r.ok and r.first_bad_file == file_names.manifest_name(sha1)


def _bad(files: list[tuple[str, bytes]], expect: ChainExpectation) -> VerifyReport:
    report = verify_chain(files, expect=expect)
    assert not report.ok
    assert report.reason and "{" not in report.reason  # a description, not file contents
    return report


def test_flipped_byte_in_batch_2() -> None:
    c = build_chain()
    data = bytearray(c.data(2))
    data[len(data) // 2] ^= 0x01
    files = [*c.files[:2], (c.name(2), bytes(data)), c.files[3]]
    r = _bad(files, c.expect)
    assert r.first_bad_file == c.name(2) and "hash" in (r.reason or "")
    assert (r.batches, r.roots) == (1, 2)


def test_renamed_file() -> None:
    c = build_chain()
    other = file_names.batch_name(2, "f" * 64)
    r = _bad([*c.files[:2], (other, c.data(2)), c.files[3]], c.expect)
    assert r.first_bad_file == other
    moved = file_names.batch_name(4, fv.sha256_hex(c.data(2)))
    r = _bad([*c.files[:2], (moved, c.data(2)), c.files[3]], c.expect)
    assert r.first_bad_file == c.name(2) and "missing" in (r.reason or "")


def test_missing_batch_and_missing_tail_and_manifest() -> None:
    c = build_chain()
    r = _bad([c.files[0], c.files[1], c.files[3]], c.expect)
    assert r.first_bad_file == c.name(2)  # exact name, recovered from batch 3's prev_sha256
    r = _bad(c.files[:3], c.expect)
    assert r.first_bad_file == c.name(3)
    r = _bad(c.files[1:], c.expect)
    assert r.first_bad_file == c.name(0)


def test_extra_batch_beyond_confirmed() -> None:
    c = build_chain()
    confirmed = with_expect(
        c,
        batches=2,
        roots=4,
        bytes=sum(len(d) for _, d in c.files[:3]),
        last_sha256=c.name(2)[9:73],
    )
    r = _bad(c.files, with_expect(c, batches=2, roots=4, bytes=confirmed.bytes,
                                  last_sha256=confirmed.last_sha256, complete=True))  # fmt: skip
    assert r.first_bad_file == c.name(3) and "beyond" in (r.reason or "")
    running = verify_chain(c.files, expect=with_expect(confirmed, complete=False))
    assert running.ok and running.beyond == (c.name(3),) and running.batches == 2
    stray = (file_names.batch_name(4, "e" * 64), b"leftover")
    r = _bad([*c.files, stray], c.expect)
    assert r.first_bad_file == stray[0] and "beyond" in (r.reason or "")


def test_wrong_prev_link() -> None:
    good = build_chain()
    c = build_chain(prevs={1: "b" * 64})
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(2) and "prev_sha256" in (r.reason or "")
    assert c.name(1) == good.name(1)


def test_header_seq_mismatch() -> None:
    c = build_chain(seqs=[1, 3, 3])
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(2) and "seq" in (r.reason or "")


def test_roots_over_batch_size() -> None:
    c = build_chain([[record(1), record(2), record(3)], [record(4)]])
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(1) and "batch_size" in (r.reason or "")


def test_keys_out_of_order_or_overlapping_across_batches() -> None:
    c = build_chain([[record(1), record(3)], [record(2), record(4)]])
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(2) and "overlap" in (r.reason or "")
    c = build_chain([[record(1), record(2)], [record(2), record(4)]])
    assert _bad(c.files, c.expect).first_bad_file == c.name(2)


def test_root_outside_range() -> None:
    c = build_chain(range_from=T0 + timedelta(seconds=2))
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(1) and "range" in (r.reason or "")
    c = build_chain(range_until=T0 + timedelta(seconds=5))  # until is exclusive
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(3)


def test_key_bounds_split_one_settled_time_between_two_chains() -> None:
    """A range whose bounds are keys (settled, id) (SPEC §5 budget-sized ranges): roots 1..5
    settled in one microsecond, the first chain ends before root 3, the second starts at it.
    The manifest names the ids (``from_id``, ``until_id``), the verifier holds each batch to
    the keys, and the expectation's ids must match the manifest's."""
    at = T0 + timedelta(seconds=1)
    recs = [record(i, settled=at) for i in range(1, 6)]
    first = build_chain([recs[:2]], range_until=at, range_until_id=rid(3))
    second = build_chain([recs[2:4], recs[4:]], range_from=at, range_from_id=rid(3))
    for chain, ids in ((first, (None, rid(3))), (second, (rid(3), None))):
        lo = None if ids[0] is None else at
        hi = at if ids[1] is not None else UNTIL
        expect = replace(chain.expect, range=(lo, hi), range_ids=ids)
        assert verify_chain(chain.files, expect=expect).ok
        other = replace(expect, range_ids=(None, None))
        assert "range differs" in (_bad(chain.files, other).reason or "")
    doc = fm.decode_manifest(first.data(0))["range"]
    assert doc == {"from": None, "until": fv.format_ts(at), "until_id": rid(3).hex()}
    over = build_chain([recs[:2], recs[2:3]], range_until=at, range_until_id=rid(3))  # root 3
    assert "outside" in (_bad(over.files, over.expect).reason or "")
    under = build_chain([recs[1:3]], range_from=at, range_from_id=rid(3))  # root 2 is outside
    assert "outside" in (_bad(under.files, under.expect).reason or "")


@pytest.mark.parametrize(
    "edit",
    [
        {"until_id": "AB" * 16},  # not lowercase hex
        {"until_id": "ab"},
        {"from_id": "ab" * 16},  # from is null: a key needs a time
        {"until_key": "ab" * 16},
    ],
)
def test_manifest_range_keys_are_checked(edit: dict[str, str]) -> None:
    doc = json.loads(build_chain().data(0))
    doc["range"].update(edit)
    with pytest.raises(fv.FormatError, match="range"):
        fm.decode_manifest(fv.canonical_json(doc))


def test_final_flag_on_middle_batch_and_missing_final() -> None:
    c = build_chain(finals=[False, True, True])
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(2) and "final" in (r.reason or "")
    c = build_chain(finals=[False, False, False])
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(3) and "final" in (r.reason or "")
    assert verify_chain(c.files, expect=with_expect(c, complete=False)).ok


def test_totals_mismatch() -> None:
    c = build_chain()
    r = _bad(c.files, with_expect(c, roots=4))
    assert r.first_bad_file == c.name(3) and "roots" in (r.reason or "")
    r = _bad(c.files, with_expect(c, bytes=c.expect.bytes + 1))
    assert r.first_bad_file == c.name(3) and "bytes" in (r.reason or "")
    c6 = build_chain(roots_total=6)
    r = _bad(c6.files, c6.expect)
    assert r.first_bad_file == c6.name(0) and "roots_total" in (r.reason or "")
    assert verify_chain(c6.files, expect=with_expect(c6, complete=False)).ok


def test_last_sha256_mismatch() -> None:
    c = build_chain()
    r = _bad(c.files, with_expect(c, last_sha256="c" * 64))
    assert r.first_bad_file == file_names.batch_name(3, "c" * 64) and "last_sha256" in (
        r.reason or ""
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("storage_id", bytes(16)),
        ("namespace_id", bytes(16)),
        ("job_id", bytes(16)),
        ("kind", "events"),
        ("batch_size", 3),
        ("plan_revision", 4),
        ("policy_revision", 1),
    ],
)
def test_manifest_field_mismatch(field: str, value: object) -> None:
    c = build_chain()
    r = _bad(c.files, with_expect(c, **{field: value}))
    assert r.first_bad_file == c.name(0) and field in (r.reason or "")


def test_manifest_range_checked_when_given() -> None:
    c = build_chain()
    assert verify_chain(c.files, expect=with_expect(c, range=(None, UNTIL))).ok
    r = _bad(c.files, with_expect(c, range=(T0, UNTIL)))
    assert r.first_bad_file == c.name(0) and "range" in (r.reason or "")


def test_duplicate_and_foreign_files() -> None:
    c = build_chain()
    alt = build_chain([[record(1), record(2)], [record(3, attempts=2), record(4)], [record(5)]])
    dup = (alt.name(2), alt.data(2))  # a valid batch 2 that is not the confirmed one
    r = _bad([*c.files, dup], c.expect)
    # Both files fit the chain at position 2; the one whose name sorts second is reported.
    assert r.first_bad_file == max(dup[0], c.name(2)) and "second file" in (r.reason or "")
    r = _bad([*c.files, ("notes.txt", b"hi")], c.expect)
    assert r.first_bad_file == "notes.txt"


def test_child_rows_must_belong_to_their_root() -> None:
    r1 = record(1)
    foreign = ff.RootRecord(
        r1.root, {"orbit_task_attempts": record(9).children["orbit_task_attempts"]}
    )
    c = build_chain([[foreign, record(2)], [record(3)]])
    r = _bad(c.files, c.expect)
    assert r.first_bad_file == c.name(1) and "child" in (r.reason or "")
    c = build_chain([[ff.RootRecord(r1.root, {}), ff.RootRecord(record(2).root, {})]])
    assert "child tables" in (_bad(c.files, c.expect).reason or "")


def test_nothing_confirmed_yet() -> None:
    c = build_chain()
    empty = with_expect(c, batches=0, roots=0, bytes=0, last_sha256="", complete=False)
    r = verify_chain(c.files, expect=empty)
    assert r.ok and len(r.beyond) == 4 and r.cursor is None
    assert not verify_chain(c.files, expect=with_expect(empty, complete=True)).ok
    assert verify_prefix([], expect=empty).ok


def test_verify_prefix_tail_only_and_full() -> None:
    c = build_chain()
    running = with_expect(c, complete=False)
    r = verify_prefix([c.files[3]], expect=running)
    assert r.ok and r.cursor == (T0 + timedelta(seconds=5), rid(5)) and r.final
    r = verify_prefix([c.files[0]], expect=running)
    assert not r.ok and r.first_bad_file == c.name(3)
    flipped = bytearray(c.data(3))
    flipped[20] ^= 0x40
    r = verify_prefix([(c.name(3), bytes(flipped))], expect=running)
    assert not r.ok and r.first_bad_file == c.name(3)
    m = with_expect(c, batches=0, roots=0, bytes=len(c.data(0)), last_sha256=c.name(0)[9:73])
    r = verify_prefix(c.files, expect=m)
    assert r.ok and r.cursor is None and r.beyond == tuple(n for n, _ in c.files[1:])
    r = verify_prefix(c.files, expect=with_expect(m, storage_id=bytes(16)))
    assert not r.ok and r.first_bad_file == c.name(0)
    # Tail-only does not read the middle of the chain; full=True does.
    broken = [c.files[0], (c.name(1), b"garbage"), *c.files[2:]]
    assert verify_prefix(broken, expect=running).ok
    r = verify_prefix(broken, expect=running, full=True)
    assert not r.ok and r.first_bad_file == c.name(1)


def test_a_chain_walked_in_parts_is_the_whole_walk() -> None:
    """verify_chain_part (issue 24 item 4): one file per part, resumed from the progress each
    part returns, ends with the same report as one walk; damage found in a later part is
    named; a wrong progress (its manifest gone) is a bad file, never a pass."""
    c = build_chain()
    whole = verify_prefix(c.files, expect=c.expect, full=True)
    progress, parts = None, 0
    while True:
        report, progress = verify_chain_part(
            c.files, expect=c.expect, progress=progress, more=lambda: False
        )
        parts += 1
        if progress is None:
            break
        assert report.ok and progress.checked == parts
    assert parts == 4 and report == whole
    data = bytearray(c.data(3))
    data[len(data) // 2] ^= 0x01
    broken = [*c.files[:3], (c.name(3), bytes(data))]
    first, at = verify_chain_part(broken, expect=c.expect, progress=None, more=lambda: True)
    assert first.ok is False and first.first_bad_file == c.name(3) and at is None
    answers = iter([True, False])
    _, two = verify_chain_part(broken, expect=c.expect, progress=None, more=lambda: next(answers))
    assert two is not None and two.checked == 2  # the manifest and batch 1, then stopped
    later, done = verify_chain_part(broken, expect=c.expect, progress=two, more=lambda: True)
    assert not later.ok and later.first_bad_file == c.name(3) and done is None
    gone, _ = verify_chain_part(c.files[1:], expect=c.expect, progress=two, more=lambda: True)
    assert not gone.ok and gone.first_bad_file == c.name(0)


@pytest.mark.slow
def test_a_chain_of_ten_thousand_files_walked_a_thousand_files_per_claim() -> None:
    """The final step's bound per claim with a large count (issue 24 item 4): 10,001 files
    walked 1,000 per part, each part resumed from the last one's progress; every file is read
    once (the manifest once more per resume) and the end is the one-walk report."""
    c = build_chain([[record(i)] for i in range(1, 10_001)], batch_size=1)
    reads: list[str] = []
    lazy = [(n, (lambda n=n, d=d: reads.append(n) or d)) for n, d in c.files]
    whole = verify_prefix(c.files, expect=c.expect, full=True, lines="ends")
    assert whole.ok and whole.batches == 10_000
    progress, parts = None, 0
    while True:
        budget = iter(range(999))  # 1,000 files per part: the first is free

        def more(b: Iterator[int] = budget) -> bool:
            return next(b, None) is not None

        report, progress = verify_chain_part(
            lazy, expect=c.expect, progress=progress, more=more, lines="ends"
        )
        parts += 1
        if progress is None:
            break
        assert report.ok and progress.checked == 1_000 * parts
    assert parts == 11 and report == whole
    assert len(reads) == 10_001 + 10 and len(set(reads)) == 10_001
