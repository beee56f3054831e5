"""Retiring storages and namespaces (issue 27): ``orbit storage retire ID|LABEL --reason`` and
``orbit namespace retire NS --reason``.

Real MariaDB, the real ``orbit`` script, real volumes, the real runner archiving real history.
A retirement is refused (exit 3, one line naming what holds it, nothing written) while enabled
plans or PENDING/RUNNING/FAILED jobs hold the storage or namespace; once done it is audited,
the retired one leaves the lists (``--all`` shows it), gets no new plans, and its archives stay
readable (``job verify``, ``job export``, ``job restore``). A second retirement is exit 0 and
writes nothing.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.store.controls import PLATFORM_NAMESPACE
from orbit_tasks.cli.namespace import ACTIVE_JOB_STATES
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import (
    KINDS,
    archive_jobs,
    archive_plans,
    namespaces,
    retirements,
)
from orbit_tasks.ids import new_id
from orbit_tasks.platform import store
from tests.support.archive_jobs import (
    ORBIT,
    ArchiveEnv,
    archive_env,
    create_job,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_for,
    wait_state,
)
from tests.support.s3 import MotoServer, bucket_name
from tests.support.s3 import moto_fixture as moto_fixture  # the session's S3 server
from tests.support.scene import Scene, archive_scene, deliver

pytestmark = pytest.mark.mariadb


def _one_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Exit ``code``, exactly one ``error:`` line (no traceback) holding every needle."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout == ""
    return lines[0]


def _rows(engine: Engine) -> tuple[int, int, list[tuple[Any, ...]]]:
    """Retirement rows, audit rows, and every namespace's (name, state): what a refusal must
    leave as it was."""
    with engine.connect() as conn:
        return (
            conn.execute(select(func.count()).select_from(retirements)).scalar_one(),
            conn.execute(select(func.count()).select_from(audit_events)).scalar_one(),
            [tuple(r) for r in conn.execute(select(namespaces.c.name, namespaces.c.state))],
        )


def _archive(ae: ArchiveEnv, scene: Scene) -> Job:
    """One tick creates the plan's job; the real runner delivers it until it SUCCEEDED."""
    job = create_job(ae, scene.ns, scene.kind)
    places = {scene.storage.hex(): scene.volume}
    outcome = None
    while outcome in (None, "released"):
        outcome = deliver(job, places, ae.settings, engine=ae.engine)
    assert outcome == "succeeded", outcome
    done = ae.job(scene.ns, job.id)
    assert done.state == JobState.SUCCEEDED and done.roots > 0, done
    return done


def _items(ae: ArchiveEnv, *args: str) -> list[dict[str, Any]]:
    doc = json.loads(ae.orbit(*args, "--json").stdout)
    assert sorted(doc) == ["items", "next"]
    return list(doc["items"])


def test_a_storage_is_retired_only_once_nothing_holds_it_and_its_archive_stays_readable(
    ae: ArchiveEnv, tmp_path: Path
) -> None:
    scene = archive_scene(ae.engine, name="acme", volume=tmp_path / "vol-a", label="vol-a")
    sid = scene.storage.hex()
    reason = ["--reason", "moved to cold storage"]

    # an enabled plan holds it: refused, nothing written
    before = _rows(ae.engine)
    _one_line(
        ae.orbit("storage", "retire", "vol-a", *reason, check=False),
        3,
        f"storage {sid} ('vol-a') cannot be retired",
        "1 enabled plan (acme/tasks)",
    )
    assert _rows(ae.engine) == before

    # the plan disabled, its job still PENDING: the job holds it
    job = create_job(ae, scene.ns, scene.kind)
    ae.orbit("plan", "set", "acme", "tasks", "--disable")
    before = _rows(ae.engine)
    line = _one_line(ae.orbit("storage", "retire", sid, *reason, check=False), 3)
    assert f"1 active job (acme/{job.id.hex()} PENDING)" in line and "plan" not in line[:60]
    assert _rows(ae.engine) == before

    # the job archived (SUCCEEDED jobs hold nothing): retired, audited once
    places = {scene.storage.hex(): scene.volume}
    outcome = None
    while outcome in (None, "released"):
        outcome = deliver(job, places, ae.settings, engine=ae.engine)
    assert outcome == "succeeded"
    volume_files = sorted(p.relative_to(scene.volume) for p in scene.volume.rglob("*"))
    done = json.loads(ae.orbit("storage", "retire", "vol-a", *reason, "--json").stdout)
    assert (done["id"], done["label"], done["retired"]) == (sid, "vol-a", True)
    assert (done["retired_by"], done["retired_reason"]) == ("test-operator", reason[1])
    assert done["retired_at"].endswith("Z")
    with ae.engine.connect() as conn:
        audits = conn.execute(
            select(audit_events).where(audit_events.c.action == "archive.storage.retire")
        ).all()
        plan_enabled = conn.execute(select(archive_plans.c.enabled)).scalar_one()
    assert [(a.namespace_id, a.target_id, a.actor) for a in audits] == [
        (PLATFORM_NAMESPACE, sid, "test-operator")
    ]
    assert json.loads(audits[0].detail_json) == {"label": "vol-a", "reason": reason[1]}
    assert not plan_enabled  # the disabled plan stays, disabled

    # twice: exit 0, says so, writes nothing
    before = _rows(ae.engine)
    again = ae.orbit("storage", "retire", sid, "--reason", "other reason")
    assert "already retired" in again.stdout and "nothing changed" in again.stdout
    assert _rows(ae.engine) == before
    with ae.engine.connect() as conn:
        kept = store.retirement(conn, store.RetiredKind.STORAGE, scene.storage)
    assert kept is not None and kept.reason == reason[1]  # the first reason is kept

    # out of the list, in it with --all
    assert _items(ae, "storage", "list") == []
    listed = _items(ae, "storage", "list", "--all")
    assert [(s["id"], s["retired_reason"], s["retired_by"]) for s in listed] == [
        (sid, reason[1], "test-operator")
    ]
    assert "vol-a" in ae.orbit("storage", "list", "--all").stdout

    # no plan is enabled on it or moved to it
    _one_line(
        ae.orbit("plan", "set", "acme", "tasks", "--enable", check=False),
        3,
        f"storage {sid} is retired",
        "--storage",
    )
    ae.orbit("policy", "set", "acme", "events", "--archive-after", "1d")
    _one_line(
        ae.orbit(
            "plan",
            "set",
            "acme",
            "events",
            "--storage",
            sid,
            "--interval",
            "1d",
            "--batch-size",
            "10",
            "--max-bytes",
            "64MiB",
            "--policy-revision",
            "1",
            check=False,
        ),  # fmt: skip
        3,
        f"storage {sid} is retired",
    )
    with ae.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(archive_plans)).scalar_one() == 1
    # another change of the disabled plan is no new plan on it: allowed
    ae.orbit("plan", "set", "acme", "tasks", "--batch-size", "7")

    # its archive stays readable, and nothing on the volume changed
    verify = ae.orbit("job", "verify", "acme", job.id.hex(), "--volume", str(scene.volume))
    assert verify.returncode == 0, verify.stderr
    exported = ae.orbit("job", "export", "acme", job.id.hex(), "--volume", str(scene.volume))
    archived = ae.job(scene.ns, job.id)
    assert len(exported.stdout.splitlines()) == archived.roots > 0
    into = tmp_path / "restored.sqlite3"
    restored = ae.orbit(
        "job", "restore", "acme", job.id.hex(), "--volume", str(scene.volume),
        "--into", f"sqlite:///{into}",
    )  # fmt: skip
    assert restored.returncode == 0, restored.stderr
    with sqlite3.connect(into) as db:
        assert db.execute("SELECT COUNT(*) FROM orbit_tasks").fetchone()[0] == archived.roots
    window = tmp_path / "window.sqlite3"
    ae.orbit(
        "archive", "restore", "acme", "tasks", "--volume", str(scene.volume),
        "--into", f"sqlite:///{window}",
    )  # fmt: skip
    with sqlite3.connect(window) as db:
        assert db.execute("SELECT COUNT(*) FROM orbit_tasks").fetchone()[0] == archived.roots
    assert sorted(p.relative_to(scene.volume) for p in scene.volume.rglob("*")) == volume_files


def test_a_namespace_is_retired_only_once_nothing_holds_it(ae: ArchiveEnv, tmp_path: Path) -> None:
    scene = archive_scene(ae.engine, name="globex", volume=tmp_path / "vol-g", label="vol-g")
    archive_scene(ae.engine, name="initech", volume=tmp_path / "vol-i", label="vol-i")
    reason = ["--reason", "customer left"]

    before = _rows(ae.engine)
    _one_line(
        ae.orbit("namespace", "retire", "globex", *reason, check=False),
        3,
        "namespace 'globex' cannot be retired: it holds 1 enabled plan (globex/tasks)",
        "orbit plan set NS KIND --disable",
    )
    assert _rows(ae.engine) == before  # still ACTIVE, no row, no audit

    # a FAILED job holds it too (it waits for `job retry` or `job abandon`)
    job = create_job(ae, scene.ns, scene.kind)
    ae.orbit("plan", "set", "globex", "tasks", "--disable")
    with ae.engine.begin() as conn:  # what a failed claim leaves (a test shortcut)
        conn.execute(
            archive_jobs.update()
            .where(archive_jobs.c.id == job.id)
            .values(state=JobState.FAILED.value, error_code="CHAIN_BROKEN")
        )
    _one_line(
        ae.orbit("namespace", "retire", scene.ns.hex(), *reason, check=False),
        3,
        f"1 active job (globex/{job.id.hex()} FAILED)",
    )
    ae.orbit("job", "abandon", "globex", job.id.hex())

    done = json.loads(ae.orbit("namespace", "retire", "globex", *reason, "--json").stdout)
    assert (done["name"], done["retired"], done["retired_reason"]) == ("globex", True, reason[1])
    with ae.engine.connect() as conn:
        state = conn.execute(
            select(namespaces.c.state).where(namespaces.c.id == scene.ns)
        ).scalar_one()
        audits = conn.execute(
            select(audit_events.c.namespace_id, audit_events.c.detail_json).where(
                audit_events.c.action == "namespace.retire"
            )
        ).all()
    assert state == "DISABLED"
    assert [(a.namespace_id, json.loads(a.detail_json)) for a in audits] == [
        (scene.ns, {"name": "globex", "reason": reason[1], "state": ["ACTIVE", "DISABLED"]})
    ]

    before = _rows(ae.engine)
    again = ae.orbit("namespace", "retire", "globex", *reason)
    assert "already retired" in again.stdout
    assert _rows(ae.engine) == before

    assert [n["name"] for n in _items(ae, "namespace", "list")] == ["initech"]
    every = {n["name"]: n for n in _items(ae, "namespace", "list", "--all")}
    assert every["globex"]["state"] == "RETIRED" and every["globex"]["retired_reason"] == reason[1]
    assert every["initech"]["state"] == "ACTIVE" and every["initech"]["retired_at"] is None

    # no new plans, policies or queues; its jobs stay listed
    _one_line(ae.orbit("plan", "set", "globex", "tasks", "--enable", check=False), 3, "DISABLED")
    _one_line(
        ae.orbit("policy", "set", "globex", "tasks", "--archive-after", "1d", check=False),
        3,
        "DISABLED",
    )
    _one_line(ae.orbit("queue", "create", "globex", "q2", check=False), 3, "DISABLED")
    assert [j["id"] for j in _items(ae, "job", "list", "globex")] == [job.id.hex()]


def test_bad_input_is_one_line_and_writes_nothing(ae: ArchiveEnv, tmp_path: Path) -> None:
    archive_scene(ae.engine, name="acme", volume=tmp_path / "vol-a", label="twin")
    make_volume(ae.engine, tmp_path / "vol-b", "twin")
    make_volume(ae.engine, tmp_path / "vol-c", "")
    before = _rows(ae.engine)
    cases: list[tuple[list[str], int, str]] = [
        (["storage", "retire", "twin", "--reason", "x"], 2, "label 'twin' names 2 storages"),
        (["storage", "retire", "", "--reason", "x"], 2, "storage '' is invalid"),
        (["storage", "retire", "nope", "--reason", "x"], 4, "storage 'nope' is not registered"),
        (["storage", "retire", new_id().hex(), "--reason", "x"], 4, "is not registered"),
        (["namespace", "retire", "nope", "--reason", "x"], 4, "namespace 'nope' does not exist"),
        (["namespace", "retire", "acme", "--reason", "a\nb"], 2, "--reason"),
        (["namespace", "retire", "acme", "--reason", " "], 2, "--reason"),
        (["storage", "retire", "twin", "--reason", "x" * 501], 2, "allowed 1..500"),
        (["namespace", "retire", "acme"], 2, "--reason"),
    ]
    for args, code, needle in cases:
        _one_line(ae.orbit(*args, check=False), code, needle)
    assert _rows(ae.engine) == before


def _lock_waits(engine: Engine) -> int:
    """Transactions of this test's database waiting for a row lock (the server is shared)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT COUNT(*) FROM information_schema.INNODB_TRX t "
                    "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                    "WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()"
                )
            ).scalar_one()
        )


def _started(ae: ArchiveEnv, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [ORBIT, *args], env=ae.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_retirement_and_a_plan_enabled_at_once_never_both_commit(
    ae: ArchiveEnv, tmp_path: Path
) -> None:
    """Each order of the race: a real ``orbit`` process against a transaction held open by the
    test. Whichever commits first wins; the other waits for it and is refused (exit 3)."""
    scene = archive_scene(ae.engine, name="race", volume=tmp_path / "vol-r", label="vol-r")
    sid = scene.storage.hex()
    ae.orbit("plan", "set", "race", "tasks", "--disable")

    # plan set first: its enabled plan, uncommitted, makes the retire wait, then refuses it
    with ae.engine.connect() as conn:
        trans = conn.begin()
        plan_store.set_plan(
            conn, scene.ns, "tasks", storage_id=None, interval=None, batch_size=None,
            max_bytes=None, policy_revision=None, enabled=True, expect_revision=None,
            now=db_now(conn), actor="test",
        )  # fmt: skip
        retire = _started(ae, "storage", "retire", sid, "--reason", "race")
        wait_for(lambda: _lock_waits(ae.engine) >= 1, 30, "the retire waiting for plan set")
        assert retire.poll() is None  # waiting, not done
        trans.commit()
    out, err = retire.communicate(timeout=60)
    assert retire.returncode == 3, (out, err)
    assert "1 enabled plan (race/tasks)" in err
    with ae.engine.connect() as conn:
        assert store.retirement(conn, store.RetiredKind.STORAGE, scene.storage) is None

    # the retirement first: plan set waits for it, then is refused
    ae.orbit("plan", "set", "race", "tasks", "--disable")
    with ae.engine.connect() as conn:
        trans = conn.begin()
        assert (
            store.insert_retirement(
                conn,
                store.RetiredKind.STORAGE,
                scene.storage,
                reason="race",
                actor="test",
                at=db_now(conn),
            )  # fmt: skip
            is None
        )
        enable = _started(ae, "plan", "set", "race", "tasks", "--enable")
        wait_for(lambda: _lock_waits(ae.engine) >= 1, 30, "plan set waiting for the retire")
        assert not store.holds(conn, storage_id=scene.storage, active_states=ACTIVE_JOB_STATES)
        trans.commit()
    out, err = enable.communicate(timeout=60)
    assert enable.returncode == 3, (out, err)
    assert f"storage {sid} is retired" in err
    with ae.engine.connect() as conn:
        enabled = conn.execute(select(archive_plans.c.enabled)).scalar_one()
    assert not enabled


def test_the_holds_reads_use_their_indexes(ae: ArchiveEnv, tmp_path: Path) -> None:
    """The locking reads of a retirement stay on index ranges of the storage or namespace (no
    scan locking every plan or job): EXPLAIN on MariaDB over 8 storages with a plan of each
    kind and 1,600 finished jobs."""
    storages = [new_id() for _ in range(8)]
    with ae.engine.begin() as conn:
        now = db_now(conn)
        rows = []
        for i, sid in enumerate(storages):
            store.register_storage(conn, sid, f"v{i}")
            ns = store.create_namespace(conn, f"n{i}")
            for kind in KINDS:
                store.add_policy_revision(conn, ns, kind, 86400, "test")
                result = plan_store.set_plan(
                    conn, ns, kind, storage_id=sid, interval=86400, batch_size=10,
                    max_bytes=1 << 20, policy_revision=1, enabled=i % 2 == 0,
                    expect_revision=None, now=now, actor="test",
                )  # fmt: skip
                for _ in range(200 // len(KINDS) + 1):
                    row = plan_store.new_job_row(result.plan, new_id(), now)
                    rows.append(row | {"state": JobState.ABANDONED.value})
        conn.execute(archive_jobs.insert(), rows)
        conn.exec_driver_sql("ANALYZE TABLE orbit_archive_plans, orbit_archive_jobs")
        target_ns = store.resolve_namespace(conn, "n0").id
    cases = [
        (store.holds_queries(storage_id=storages[0], active_states=ACTIVE_JOB_STATES),
         ({"ix_archive_plan_due"}, {"ix_archive_job_claim"})),
        (store.holds_queries(namespace_id=target_ns, active_states=ACTIVE_JOB_STATES),
         ({"PRIMARY"}, {"PRIMARY", "ix_archive_job_list"})),
    ]  # fmt: skip
    with ae.engine.connect() as conn:
        for queries, indexes in cases:
            for query, allowed in zip(queries, indexes, strict=True):
                compiled = query.compile(conn, compile_kwargs={"render_postcompile": True})
                params = tuple(compiled.params[k] for k in compiled.positiontup or ())
                rows_ = conn.exec_driver_sql("EXPLAIN " + str(compiled), params).mappings().all()
                assert rows_[0]["key"] in allowed, (str(compiled), rows_)
                assert rows_[0]["type"] in ("ref", "range"), rows_


def test_a_retired_s3_storage_stays_readable_through_its_url(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, moto: MotoServer
) -> None:
    """An S3 storage (the moto server) archived by a real worker, retired by its label: its
    location stays registered, so ``--volume s3://...`` still verifies, exports and restores;
    ``storage list --all`` shows where it lives."""
    # a lease of a minute: the session bounds of the test default (6 s) close an idle session
    # while a command reads objects from moto on a loaded machine
    env = {**moto.env(), "ORBIT_ARCHIVE_LEASE_SECONDS": "60"}
    with archive_env(mariadb_url, platform_engine, tmp_path, **env) as ae:
        bucket = moto.bucket(bucket_name("retire"))
        url = f"s3://{bucket}/old"
        sid = json.loads(ae.orbit(*moto.init_args(url), "--label", "cold", "--json").stdout)["id"]
        ns, queue = make_namespace(ae.engine, "s3r")
        make_plan(ae.engine, ns, "tasks", bytes.fromhex(sid), batch_size=6)
        seed(ae.engine, ns, queue, "tasks", 20)
        ae.worker("s3", [url])
        job = create_job(ae, ns, "tasks")
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=120)
        assert done.state is JobState.SUCCEEDED, done
        keys = moto.keys(bucket)

        ae.orbit("plan", "set", "s3r", "tasks", "--disable")
        ae.orbit("storage", "retire", "cold", "--reason", "bucket frozen")
        assert _items(ae, "storage", "list") == []
        [listed] = _items(ae, "storage", "list", "--all")
        assert (listed["id"], listed["location"]) == (sid, f"{url} at {moto.endpoint}")
        assert listed["retired_reason"] == "bucket frozen"

        verify = ae.orbit("job", "verify", "s3r", job.id.hex(), "--volume", url, "--json")
        assert json.loads(verify.stdout)["ok"] is True
        exported = ae.orbit("job", "export", "s3r", job.id.hex(), "--volume", url)
        assert len(exported.stdout.splitlines()) == done.roots > 0
        into = tmp_path / "s3r.sqlite3"
        ae.orbit(
            "job", "restore", "s3r", job.id.hex(), "--volume", url, "--into", f"sqlite:///{into}"
        )
        with sqlite3.connect(into) as db:
            assert db.execute("SELECT COUNT(*) FROM orbit_tasks").fetchone()[0] == done.roots
        assert moto.keys(bucket) == keys  # nothing written or removed


def test_the_refusal_names_five_of_each_and_counts_the_rest() -> None:
    """Pure: the wording of what holds a storage or namespace (the first five, then how many
    more), one line however many."""
    holds = store.Holds(
        plans=("a/tasks",),
        plan_count=1,
        jobs=tuple(f"a/{i:032x} PENDING" for i in range(5)),
        job_count=12,
    )
    text_ = holds.describe()
    assert text_.startswith("1 enabled plan (a/tasks) and 12 active jobs (a/")
    assert text_.endswith(" PENDING, 7 more)") and "\n" not in text_
    assert store.Holds((), 0, ("a/x FAILED",), 1).describe() == "1 active job (a/x FAILED)"
    assert not store.Holds((), 0, (), 0)
