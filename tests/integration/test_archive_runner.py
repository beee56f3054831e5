"""The runner's constant work per batch (issue 8), in process on MariaDB with real files.

A claim chain carries what it confirmed into the next claim: about 2 statements per batch (the
fenced UPDATE that confirms a file and chains the next claim, its COMMIT, and a share of the
read-ahead's multi-batch queries), no directory listing and no file read per batch, and a
final step that verifies the chain one file at a time.
"""

from __future__ import annotations

import logging
import os
import random
import re
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

from orbit_tasks import counters
from orbit_tasks.archive import claims
from orbit_tasks.archive.engine import budget, runner, verify, volume
from orbit_tasks.archive.engine.volume import job_dir, write_job_file
from orbit_tasks.archive.format import batch as ff
from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.jobs import JobState
from tests.support.archive_chain import build_chain, record
from tests.support.archive_jobs import (
    ArchiveEnv,
    assert_succeeded_exactly,
    create_job,
)
from tests.support.scene import archive_scene

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]


class _Statements:
    """Every statement and transaction end the engine sends (all its connections)."""

    def __init__(self, engine: Engine) -> None:
        self.sql: list[str] = []
        self.ends = 0
        self._engine = engine
        event.listen(engine, "before_cursor_execute", self._stmt)
        event.listen(engine, "commit", self._end)
        event.listen(engine, "rollback", self._end)

    def _stmt(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.sql.append(" ".join(statement.split()))

    def _end(self, conn: Any) -> None:
        self.ends += 1

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._stmt)
        event.remove(self._engine, "commit", self._end)
        event.remove(self._engine, "rollback", self._end)

    def kinds(self) -> Counter[str]:
        """``"<VERB> <first table>"`` -> count."""
        out: Counter[str] = Counter()
        for sql in self.sql:
            table = re.search(r"\b(?:FROM|UPDATE|INTO)\s+(\w+)", sql)
            out[f"{sql.split()[0]} {table.group(1) if table else ''}"] += 1
        return out


def test_statements_listings_and_reads_per_batch_stay_constant(
    ae: ArchiveEnv, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ns, q, vol, sid = archive_scene(
        ae.engine, name="perbatch", volume=ae.tmp / "vol", batch_size=10,
        roots=800,  # ~640 settled roots: ~64 batches
    ).parts  # fmt: skip
    job = create_job(ae, ns, "tasks")
    listings: list[str] = []
    reads: list[str] = []
    real_listdir, real_read = os.listdir, volume.read_file

    def listdir(path: Any) -> list[str]:
        listings.append(str(path))
        return real_listdir(path)

    def read_file(path: Path) -> bytes:
        reads.append(Path(path).name)
        return real_read(path)

    monkeypatch.setattr(volume.os, "listdir", listdir)
    monkeypatch.setattr(volume, "read_file", read_file)
    stmts = _Statements(ae.engine)
    caplog.set_level(logging.INFO, "orbit.archive.engine.runner")
    try:  # the read-ahead in threads: its reads are counted on this engine too
        out = runner.run_job(
            ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings.with_overrides(
                archive_reader="thread"), engine=ae.engine, publish=lambda *a, **k: None,
        )  # fmt: skip
    finally:
        stmts.close()
    assert out == "succeeded"
    done = ae.job(ns, job.id)
    assert done.batches >= 50 and done.attempts == done.batches + 1
    per_batch = (len(stmts.sql) + stmts.ends) / done.batches
    kinds = stmts.kinds()
    print(f"statements and transaction ends per batch: {per_batch:.2f} {dict(kinds)}")
    assert per_batch <= 3.0, (per_batch, kinds)  # issue 8: about 5 instead of 13
    # one fenced UPDATE per confirmed group of files (group durability: the manifest, then
    # groups of up to GROUP_FILES batches; + the first claim and the finalize)
    groups = [
        r.fields for r in caplog.records if getattr(r, "action", "") == "archive.job.confirmed"
    ]
    assert sum(g["files"] for g in groups) == done.batches + 1
    assert all(1 <= g["files"] <= claims.GROUP_FILES for g in groups), groups
    assert kinds["UPDATE orbit_archive_jobs"] == len(groups) + 2, kinds
    # roots: several batches per keyset query (+ the manifest's count); children: one query
    # (the same keyset walk joined to the attempts) per root query. Before the manifest, the
    # budget's sample (SPEC §5 budget-sized ranges): the settled span, SAMPLE_POINTS root reads
    # with their children, and the cut's walk of the settled index
    children = sum("JOIN orbit_task_attempts" in sql for sql in stmts.sql) - budget.SAMPLE_POINTS
    chunks = kinds["SELECT orbit_tasks"] - 1 - children - (2 + 2 * budget.SAMPLE_POINTS)
    assert chunks <= done.batches / 5, kinds
    assert children == chunks, kinds
    # the job row, the claim, the range (the earlier successes, the greatest recorded end)
    assert kinds["SELECT orbit_archive_jobs"] <= 4, kinds
    assert kinds["SELECT orbit_archive_policies"] == 1, kinds  # the range, once per chain
    assert kinds["INSERT orbit_archive_job_ends"] == 1, kinds  # the range's end, recorded once
    # the directory is listed once (the final step) and every file read once (its verify)
    assert listings == [str(job_dir(vol, ns, job.id))]
    assert sorted(reads) == sorted(os.listdir(job_dir(vol, ns, job.id)))
    assert_succeeded_exactly(ae, done, vol)


def test_with_a_reader_process_the_runner_reads_no_source_row(
    ae: ArchiveEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """ORBIT_ARCHIVE_READER=process (the default on MariaDB): the runner's connection counts
    the manifest's roots (and samples the range's size) and confirms; every batch's keyset read
    runs in the reader process."""
    ns, q, vol, sid = archive_scene(
        ae.engine, name="byprocess", volume=ae.tmp / "vol", roots=400, batch_size=10
    ).parts
    job = create_job(ae, ns, "tasks")
    stmts = _Statements(ae.engine)
    caplog.set_level(logging.INFO, "orbit.archive.engine.runner")
    try:
        out = runner.run_job(
            ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings.with_overrides(
                archive_reader="auto"), engine=ae.engine, publish=lambda *a, **k: None,
        )  # fmt: skip
    finally:
        stmts.close()
    assert out == "succeeded"
    done = ae.job(ns, job.id)
    kinds = stmts.kinds()
    # the manifest's count, and before it the budget's sample (SPEC §5 budget-sized ranges:
    # the settled span, SAMPLE_POINTS reads of 16 roots with their children, the cut's walk)
    assert kinds["SELECT orbit_tasks"] == 1 + 2 + 2 * budget.SAMPLE_POINTS, kinds
    joins = sum("JOIN orbit_task_attempts" in sql for sql in stmts.sql)
    assert joins == budget.SAMPLE_POINTS
    # one fenced UPDATE per confirmed group (+ the first claim and the finalize)
    confirmed = "archive.job.confirmed"
    groups = [r.fields for r in caplog.records if getattr(r, "action", "") == confirmed]
    assert sum(g["files"] for g in groups) == done.batches + 1
    assert kinds["UPDATE orbit_archive_jobs"] == len(groups) + 2, kinds
    assert_succeeded_exactly(ae, done, vol)


def test_a_takeover_lists_once_more_and_a_continuation_reads_only_the_tail(
    ae: ArchiveEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orbit_tasks.archive.store import jobs as job_store
    from orbit_tasks.db.engine import FixedClock, db_now

    ns, q, vol, sid = archive_scene(
        ae.engine, name="takeover", volume=ae.tmp / "vol", roots=60, batch_size=5
    ).parts
    job = create_job(ae, ns, "tasks")

    def run(**over: Any) -> str:
        return runner.run_job(
            ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings.with_overrides(**over),
            engine=ae.engine, publish=lambda *a, **k: None,
        )  # fmt: skip

    assert run(archive_slice_seconds=0) == "released"  # manifest confirmed
    assert run(archive_slice_seconds=0) == "released"  # batch 1
    listings: list[str] = []
    reads: list[str] = []
    real_listdir, real_read = os.listdir, volume.read_file
    monkeypatch.setattr(volume.os, "listdir", lambda p: listings.append(str(p)) or real_listdir(p))
    monkeypatch.setattr(
        volume, "read_file", lambda p: reads.append(Path(p).name) or real_read(Path(p))
    )
    assert run(archive_slice_seconds=0) == "released"  # from PENDING: the tail file only
    assert listings == [] and len(reads) == 1 and reads[0].startswith("00000001-")
    with ae.engine.connect() as conn:
        past = db_now(conn).replace(year=2000)
    assert job_store.claim(ae.engine, ns, job.id, 60, clock=FixedClock(past)) is not None
    reads.clear()
    takeovers, stalls = _counted("takeovers", sid), _counted("stalls", sid)
    assert run() == "succeeded"  # a takeover: one listing for the prefix, one at the end
    assert (_counted("takeovers", sid), _counted("stalls", sid)) == (takeovers + 1, stalls)
    done = ae.job(ns, job.id)
    assert listings == [str(job_dir(vol, ns, job.id))] * 2
    assert reads.count(file_names.tail_name(0, _manifest_sha(vol, done))) == 2  # prefix + final
    assert done.state is JobState.SUCCEEDED and done.attempts == done.batches + 2
    assert_succeeded_exactly(ae, done, vol)


def _counted(what: str, storage: bytes) -> float:
    """This process's value of ``orbit_archive_<what>_total{storage}`` (orbit_tasks/counters.py;
    that counter alone: a collect of the whole registry would list /proc/self/fd)."""
    counter = counters.ARCHIVE_TAKEOVERS if what == "takeovers" else counters.ARCHIVE_STALLS
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == {"storage": storage.hex()}:
                return sample.value
    return 0.0


def test_a_stalled_takeover_is_counted_as_a_takeover_and_a_stall(ae: ArchiveEnv) -> None:
    from orbit_tasks.archive.store import jobs as job_store
    from orbit_tasks.db.engine import FixedClock, db_now

    ns, q, vol, sid = archive_scene(
        ae.engine, name="stalled", volume=ae.tmp / "vol", roots=20, batch_size=5
    ).parts
    job = create_job(ae, ns, "tasks")

    def run(**over: Any) -> str:
        return runner.run_job(
            ns.hex(), job.id.hex(), {sid.hex(): vol}, ae.settings.with_overrides(**over),
            engine=ae.engine, publish=lambda *a, **k: None,
        )  # fmt: skip

    assert run(archive_slice_seconds=0) == "released"  # the manifest, one claim
    with ae.engine.connect() as conn:
        past = db_now(conn).replace(year=2000)
    # a claim that dies at once (its lease ended in 2000): the next claim is a takeover
    assert job_store.claim(ae.engine, ns, job.id, 60, clock=FixedClock(past)) is not None
    takeovers, stalls = _counted("takeovers", sid), _counted("stalls", sid)
    assert run(archive_max_stalls=1) == "failed"  # 3 claims, no batch: stalled
    assert ae.job(ns, job.id).error_code == "STALLED"
    assert (_counted("takeovers", sid), _counted("stalls", sid)) == (takeovers + 1, stalls + 1)


def _manifest_sha(vol: Path, job: Any) -> str:
    names = os.listdir(job_dir(vol, job.namespace_id, job.id))
    return next(n for n in names if n.startswith("00000000-"))[9:73]


def test_the_final_verification_holds_one_file_at_a_time(tmp_path: Path) -> None:
    """Peak memory of verifying a chain does not grow with the number of files (the final step
    streams): 150 files of ~120 KB cost what 15 files cost, give or take their names."""
    rnd = random.Random(1)
    big = rnd.randbytes(60_000).hex()  # gzip keeps about half: ~120 KB per two-root file
    peaks = []
    for files in (15, 150):
        groups = [
            [_big(record(2 * i + 1), big[i:]), _big(record(2 * i + 2), big[: -i - 1])]
            for i in range(files)
        ]
        chain = build_chain(groups, batch_size=2)
        directory = tmp_path / f"job-{files}"
        for name, data in chain.files:
            write_job_file(directory, name, data)
        del groups
        tracemalloc.start()
        report = verify.verify_job_prefix(
            directory, chain.expect, full=True, allow_strays=True, io_errors=True
        )
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert report.ok and report.batches == files, report
        del chain
    assert peaks[1] - peaks[0] < 256 * 1024, peaks


def _big(rec: Any, text: str) -> Any:
    return ff.RootRecord({**rec.root, "result_json": '{"blob":"' + text + '"}'}, rec.children)


def test_a_value_that_cannot_be_encoded_fails_only_after_the_files_before_it(
    tmp_path: Path,
) -> None:
    """SOURCE_INVALID found by the read-ahead in batch 2 takes effect after batch 1 is confirmed
    (as if the batches were handled one after the other). SQLite keeps a float in an integer
    column: a value no archive line can hold exactly."""
    from sqlalchemy import update as sql_update

    from orbit_tasks.archive.tick import run_tick
    from orbit_tasks.db.engine import make_engine
    from orbit_tasks.db.history_tables import tasks
    from orbit_tasks.settings import load_settings
    from tests.support.db import migrated_engine

    url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
    with migrated_engine(url, "platform"):
        pass
    engine = make_engine(url)
    try:
        ns, q, vol, sid = archive_scene(
            engine, name="invalid", volume=tmp_path / "vol", roots=40, batch_size=5
        ).parts
        with engine.connect() as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    tasks.select()
                    .with_only_columns(tasks.c.id)
                    .where(tasks.c.finished_at.is_not(None))
                    .order_by(tasks.c.finished_at, tasks.c.id)
                )
            ]
        with engine.begin() as conn:  # the 8th settled root: in batch 2
            conn.execute(sql_update(tasks).where(tasks.c.id == ids[7]).values(attempts=1.5))
        settings = load_settings({"ORBIT_DATABASE_URL": url, "ORBIT_VAR_DIR": str(tmp_path)})
        report = run_tick(engine, settings, publish=lambda *a, **k: None)
        ((_, _, job_hex),) = report.jobs_created
        out = runner.run_job(
            ns.hex(), job_hex, {sid.hex(): vol}, settings, engine=engine,
            publish=lambda *a, **k: None,
        )  # fmt: skip
        assert out == "failed"
        with engine.connect() as conn:
            from orbit_tasks.archive.store import jobs as job_store

            failed = job_store.require_job(conn, ns, bytes.fromhex(job_hex))
        assert failed.error_code == "SOURCE_INVALID"
        assert failed.batches == 1 and failed.roots == 5  # batch 1 confirmed before the failure
    finally:
        engine.dispose()
