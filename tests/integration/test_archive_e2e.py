"""Archive jobs end to end: real MariaDB, Redis db 2, volume directories, `celery worker`s.

Also in-process checks of the runner's time slice and of the hot query plans (EXPLAIN).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from orbit_tasks.archive.engine import runner
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import source
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.archive_jobs import (
    archive_env,
    assert_succeeded_exactly,
    cli_json,
    create_job,
    make_due,
    make_namespace,
    make_plan,
    make_volume,
    seed,
    wait_state,
)
from tests.support.scene import archive_scene

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]

SETTLED_INDEX = {
    "tasks": "ix_task_settled",
    "workflows": "ix_workflow_settled",
    "events": "ix_event_settled",
    "audit": "ix_audit_settled",
    "deliveries": "ix_delivery_settled",
    "inbox": "ix_inbox_settled",
    "idempotency": "ix_idempotency_settled",
}


def test_batch_keyset_query_uses_the_settled_index(platform_engine: Engine) -> None:
    from datetime import datetime

    rng = ArchiveRange(datetime(2026, 1, 1), datetime(2026, 2, 1))
    cursor = (datetime(2026, 1, 2, 3, 4, 5, 6), b"\x01" * 16)
    assert set(SETTLED_INDEX) == set(HISTORY_KINDS)
    with platform_engine.connect() as conn:
        for kind, index in SETTLED_INDEX.items():
            # the read-ahead's query: several batches (1,000 roots + 1 peeked) at once, datetimes
            # formatted by the server; and the children of 1,000 roots at once
            for q in (
                source.roots_query(kind, b"\x02" * 16, rng, cursor, 101),
                source.roots_query(kind, b"\x02" * 16, rng, cursor, 1001, server_times=True),
            ):
                sql = str(q.compile(conn, compile_kwargs={"literal_binds": True}))
                assert " OR " in sql and "(" in sql  # expanded keyset form, no row constructor
                rows = conn.execute(text("EXPLAIN " + sql.replace("%", "%%"))).mappings().all()
                assert rows[0]["key"] == index and "filesort" not in rows[0]["Extra"], (kind, rows)


def test_read_ahead_children_query_walks_the_settled_index_into_the_primary_key(
    platform_engine: Engine,
) -> None:
    """The children of a chunk of ~1,000 roots in one query: the roots' keyset walk of the
    settled index, joined to the child's PRIMARY (namespace_id, parent, no). On tables with
    rows (an empty table makes any plan a full scan)."""
    import random
    from datetime import datetime, timedelta

    from orbit_tasks.db.engine import db_now
    from orbit_tasks.dev import generator
    from orbit_tasks.platform import store

    with platform_engine.begin() as conn:
        ns = store.create_namespace(conn, "explain-children")
        q = store.create_queue(conn, ns, "default")
        for kind in ("tasks", "workflows", "deliveries"):
            spec = generator.make_spec(kind, 2500, days=3)
            generator.seed_history(conn, spec, ns, [q], random.Random(1), db_now(conn))
            hk = HISTORY_KINDS[kind]
            conn.execute(text(f"ANALYZE TABLE {hk.root.name}, {hk.children[0].table.name}"))
    rng = ArchiveRange(None, datetime(2100, 1, 1))
    with platform_engine.connect() as conn:
        for kind, index in (
            ("tasks", "ix_task_settled"),
            ("workflows", "ix_workflow_settled"),
            ("deliveries", "ix_delivery_settled"),
        ):
            hk = HISTORY_KINDS[kind]
            (child,) = hk.children
            start = (db_now(conn) - timedelta(days=2), b"\x00" * 16)
            through = (db_now(conn) - timedelta(days=1), b"\xff" * 16)
            cq = source.children_query(kind, child, ns, rng, start, through, server_times=True)
            compiled = cq.compile(conn)
            cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            params = [compiled.params[p] for p in compiled.positiontup or ()]
            cur.execute("EXPLAIN " + str(compiled), params)
            plans = {row[2]: row for row in cur.fetchall()}  # table -> (.., type, keys, key, ..)
            root_plan, child_plan = plans[hk.root.name], plans[child.table.name]
            assert root_plan[5] == index and root_plan[3] == "range", (kind, plans)
            assert child_plan[5] == "PRIMARY" and child_plan[3] in ("ref", "eq_ref"), (kind, plans)
            assert "filesort" not in (root_plan[9] or "") + (child_plan[9] or ""), (kind, plans)


def test_time_slice_releases_and_continues(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """With a zero slice every confirm releases the job to PENDING and publishes a continuation;
    the job still ends SUCCEEDED with attempts == batches + 1."""
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="slice",
            volume=tmp_path / "vol",
            kind="events",
            roots=15,
            batch_size=4,
        ).parts
        job = create_job(ae, ns, "events")
        published: list[bytes] = []
        settings = ae.settings.with_overrides(archive_slice_seconds=0)
        outcomes = []
        for _ in range(50):
            out = runner.run_job(
                ns.hex(),
                job.id.hex(),
                {sid.hex(): vol},
                settings,
                engine=platform_engine,
                publish=lambda s, n, j, **_: published.append(j),
            )
            outcomes.append(out)
            if out != "released":
                break
            assert ae.job(ns, job.id).state is JobState.PENDING
        assert outcomes[-1] == "succeeded"
        final = ae.job(ns, job.id)
        assert outcomes.count("released") == final.batches  # manifest + every non-final batch
        assert published == [job.id] * final.batches
        assert final.attempts == final.batches + 1
        assert_succeeded_exactly(ae, final, vol)
        # a late duplicate wake-up after success is harmless
        assert (
            runner.run_job(
                ns.hex(), job.id.hex(), {sid.hex(): vol}, settings, engine=platform_engine
            )
            == "not_claimed"
        )
        # a wake-up on a node that does not mount the storage is ignored
        assert (
            runner.run_job(ns.hex(), job.id.hex(), {}, settings, engine=platform_engine)
            == "not_mounted"
        )


@pytest.mark.slow
def test_the_smallest_lease_with_the_largest_allowed_slice_end_to_end(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    """Issue 16 item 8: lease 4 s (soft limit 2 s) with the largest slice the settings allow
    (1 s). Slow batches (0.15 s each) make every claim reach the end of its slice: it stops at
    the batch boundary and releases, before the soft limit, and a real worker drains the job
    with no claim killed by a time limit."""
    with archive_env(
        mariadb_url, platform_engine, tmp_path,
        ORBIT_ARCHIVE_LEASE_SECONDS="4", ORBIT_ARCHIVE_SLICE_SECONDS="1",
    ) as ae:  # fmt: skip
        ns, q, vol, sid = archive_scene(
            platform_engine,
            name="tight",
            volume=tmp_path / "vol",
            kind="events",
            roots=160,
            batch_size=5,
        ).parts
        w = ae.worker("tight", [vol], failpoints="archive.after_file_write=sleep:0.15")
        job = create_job(ae, ns, "events")
        done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
        assert done.state is JobState.SUCCEEDED, done
        log = w.text()
        assert log.count("archive.job.released") >= 2  # slices ended at batch boundaries
        assert "archive.job.time_limit" not in log and "Soft time limit" not in log
        assert "exited with" not in log
        assert_succeeded_exactly(ae, done, vol)


@pytest.mark.slow
def test_two_workers_archive_all_kinds_then_only_the_new_roots(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns_hex = cli_json(ae.orbit("namespace", "create", "e2e-ns", "--json"))["id"]
        ns = bytes.fromhex(ns_hex)
        queue_hex = cli_json(ae.orbit("queue", "create", "e2e-ns", "default", "--json"))["id"]
        vols = [tmp_path / "vol-a", tmp_path / "vol-b"]
        init = ("storage", "init", "--create", "--json")  # fresh folders: --create
        sids = [cli_json(ae.orbit(*init, str(v), "--label", v.name))["id"] for v in vols]
        kinds = list(HISTORY_KINDS)
        storage_of = {k: i % 2 for i, k in enumerate(kinds)}
        for kind in kinds[:2]:  # the operator path through the CLI
            rev = ae.orbit("policy", "set", "e2e-ns", kind, "--archive-after", "1h").stdout.strip()
            ae.orbit(
                "plan",
                "set",
                "e2e-ns",
                kind,
                "--storage",
                sids[storage_of[kind]],
                "--interval",
                "1d",
                "--batch-size",
                "10",
                "--max-bytes",
                "64MiB",
                "--policy-revision",
                rev,
                "--enable",
            )
        for kind in kinds[2:]:
            make_plan(
                platform_engine, ns, kind, bytes.fromhex(sids[storage_of[kind]]), batch_size=10
            )
        for i, kind in enumerate(kinds):
            seed(platform_engine, ns, bytes.fromhex(queue_hex), kind, 40, seed=i)
        w1 = ae.worker("a", [vols[0]])
        w2 = ae.worker("b", [vols[1]])
        tick = cli_json(ae.orbit("archive", "tick", "--json"))
        assert len(tick["jobs_created"]) == len(kinds)
        jobs = {j.kind: j for j in ae.jobs(ns)}
        exported: dict[str, list[bytes]] = {}
        for kind, job in jobs.items():
            done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=90)
            assert done.state is JobState.SUCCEEDED, done
            assert done.attempts == done.batches + 1, done
            exported[kind] = assert_succeeded_exactly(ae, done, vols[storage_of[kind]])
            assert exported[kind], kind  # every kind had settled roots in range
        # the operator commands on two of them
        for kind in kinds[:2]:
            vol = str(vols[storage_of[kind]])
            job_hex = jobs[kind].id.hex()
            ok = ae.orbit("job", "verify", "e2e-ns", job_hex, "--volume", vol, "--json")
            assert cli_json(ok)["ok"] is True
            lines = ae.orbit("job", "export", "e2e-ns", job_hex, "--volume", vol).stdout
            ids = [bytes.fromhex(json.loads(ln)["root"]["id"]) for ln in lines.splitlines()]
            assert ids == exported[kind]
            wrong = ae.orbit(
                "job",
                "verify",
                "e2e-ns",
                job_hex,
                "--volume",
                str(vols[1 - storage_of[kind]]),
                check=False,
            )
            assert wrong.returncode == 2 and "belongs to storage" in wrong.stderr
        listed = cli_json(
            ae.orbit("job", "list", "e2e-ns", "--state", "SUCCEEDED", "--limit", "4", "--json")
        )
        page2 = cli_json(
            ae.orbit("job", "list", "e2e-ns", "--limit", "4", "--after", listed["next"], "--json")
        )
        assert [j["id"] for j in listed["items"] + page2["items"]] == sorted(
            j.id.hex() for j in jobs.values()
        )
        assert page2["next"] is None
        watch = ae.orbit("job", "watch", "e2e-ns", jobs["tasks"].id.hex())
        assert watch.stdout.startswith("SUCCEEDED")

        # second run: only what settled since the first job's range
        first = {k: ae.job(ns, j.id) for k, j in jobs.items()}
        seed_after = {}
        for i, kind in enumerate(["tasks", "events"]):
            seed_after[kind] = _seed_in_next_range(
                ae, ns, bytes.fromhex(queue_hex), kind, first[kind], 12, seed=100 + i
            )
            make_due(platform_engine, ns, kind)
        tick2 = ae.tick()
        new_jobs = {k: ae.job(ns, bytes.fromhex(j)) for _, k, j in tick2.jobs_created}
        assert set(new_jobs) == {"tasks", "events"}
        for kind, job in new_jobs.items():
            done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=60)
            assert done.state is JobState.SUCCEEDED, done
            ids = assert_succeeded_exactly(ae, done, vols[storage_of[kind]])
            assert sorted(ids) == sorted(seed_after[kind])
            assert not set(ids) & set(exported[kind])
        assert w1.proc.poll() is None and w2.proc.poll() is None


def _seed_in_next_range(
    ae: Any, ns: bytes, queue_id: bytes, kind: str, previous: Any, n: int, seed: int
) -> list[bytes]:
    """Insert ``n`` settled roots whose settled time lies in the next job's range:
    after the previous job's until, before now - 1h."""
    import random
    from datetime import timedelta

    from sqlalchemy import insert

    from orbit_tasks.dev import generator

    with ae.engine.connect() as conn:
        prev_until = job_store.job_range(conn, previous).until
    hk = HISTORY_KINDS[kind]
    spec = generator.make_spec(kind, n, days=1, settled_fraction=1.0)
    with ae.engine.begin() as conn:
        chunk = next(
            generator.generate(
                spec, ns, [queue_id], random.Random(seed), prev_until + timedelta(hours=1)
            )
        )
        ids = []
        for i, root in enumerate(chunk.roots):
            root[hk.settled_column] = prev_until + timedelta(microseconds=1000 * i)
            ids.append(root["id"])
        conn.execute(insert(hk.root), chunk.roots)
        if chunk.children:
            conn.execute(insert(hk.children[0].table), chunk.children)
    return ids


def test_worker_archive_verifies_volumes_before_starting(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    from orbit_tasks.archive.engine.volume import write_identity
    from orbit_tasks.ids import new_id

    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        good = tmp_path / "good"
        sid = make_volume(platform_engine, good)
        cmd = ae.orbit("worker", "archive", "--volume", str(good), "-n", "w1@h",
                       "--print-command", "--", "--without-mingle")  # fmt: skip
        out = cli_json(cmd)
        argv = out["argv"]
        assert argv[argv.index("-Q") + 1] == f"orbit.archive.{sid.hex()},orbit.control"
        assert argv[argv.index("--prefetch-multiplier") + 1] == "1"
        assert argv[argv.index("-O") + 1] == "fair" and argv[-1] == "--without-mingle"
        assert json.loads(out["env"]["ORBIT_ARCHIVE_VOLUMES"]) == {sid.hex(): str(good.resolve())}
        no_ctl = cli_json(ae.orbit("worker", "archive", "--volume", str(good), "--no-control",
                                   "--print-command"))["argv"]  # fmt: skip
        assert no_ctl[no_ctl.index("-Q") + 1] == f"orbit.archive.{sid.hex()}"
        missing = ae.orbit("worker", "archive", "--volume", str(tmp_path / "nothing"), check=False)
        assert missing.returncode == 2 and "not an archive volume" in missing.stderr
        stranger = tmp_path / "unregistered"
        write_identity(stranger, new_id(), "x")
        unknown = ae.orbit("worker", "archive", "--volume", str(stranger), check=False)
        assert unknown.returncode == 4 and "not registered" in unknown.stderr
        twice = ae.orbit("worker", "archive", "--volume", str(good), "--volume",
                         str(tmp_path / "good" / "."), check=False)  # fmt: skip
        assert twice.returncode == 3
        ctl = cli_json(ae.orbit("worker", "control", "--print-command"))["argv"]
        assert ctl[ctl.index("-Q") + 1] == "orbit.control"
        ae.orbit("sender", "db", "upgrade")  # the sender worker checks its schema first
        snd = cli_json(ae.orbit("worker", "sender", "--print-command"))["argv"]
        assert snd[snd.index("-Q") + 1] == "orbit.sender"
        beat = cli_json(ae.orbit("beat", "--print-command"))["argv"]
        assert "beat" in beat and beat[beat.index("-s") + 1].startswith(str(tmp_path / "var"))
        no_ns = ae.orbit("job", "list", "no-such-ns", check=False)
        assert no_ns.returncode == 4
        make_namespace(platform_engine, "cursor-ns")
        bad_cursor = ae.orbit("job", "list", "cursor-ns", "--after", "garbage!", check=False)
        assert bad_cursor.returncode == 2 and "--after" in bad_cursor.stderr


def test_other_hot_job_queries_use_their_indexes(platform_engine: Engine) -> None:
    from datetime import datetime

    from sqlalchemy import and_, or_

    from orbit_tasks.db.history_tables import task_attempts
    from orbit_tasks.db.platform_tables import archive_jobs as J

    ns, t = b"\x02" * 16, datetime(2026, 1, 1)
    listing = (
        select(J)
        .where(
            J.c.namespace_id == ns, or_(J.c.created_at > t, and_(J.c.created_at == t, J.c.id > ns))
        )
        .order_by(J.c.created_at, J.c.id)
        .limit(51)
    )
    children = (
        select(task_attempts)
        .where(task_attempts.c.namespace_id == ns, task_attempts.c.task_id.in_([ns, b"\x03" * 16]))
        .order_by(*task_attempts.primary_key.columns)
    )
    job = job_store.Job(
        namespace_id=ns, id=ns, kind="tasks", plan_revision=1, policy_revision=1,
        storage_id=ns, batch_size=10, max_bytes=1 << 20, state=JobState.PENDING, revision=1,
        attempts=0, batches=0, roots=0, bytes=0, last_sha256="", error_code="", lease_id=None,
        lease_until=None, created_at=t, updated_at=t,
    )  # fmt: skip
    earlier = job_store.earlier_successes_query(job)  # the range's "from" (once per claim chain)
    with platform_engine.connect() as conn:
        for q, indexes in (
            (listing, {"ix_archive_job_list"}),
            (children, {"PRIMARY"}),
            (earlier, {"ix_archive_job_list", "PRIMARY"}),  # both lead with namespace_id
        ):
            sql = str(q.compile(conn, compile_kwargs={"literal_binds": True}))
            rows = conn.execute(text("EXPLAIN " + sql)).mappings().all()
            assert rows[0]["key"] in indexes and rows[0]["type"] != "ALL", (sql, rows)


def test_job_range_uses_the_earlier_successes_and_their_own_policies(
    platform_engine: Engine,
) -> None:
    """from = the greatest until among the SUCCEEDED jobs of (namespace, kind) created before
    this one, each computed with its own policy revision; FAILED/ABANDONED, later, other-kind
    and other-namespace jobs do not count; a created_at tie is broken by id; a missing policy
    row of an earlier success is POLICY_MISSING."""
    import datetime as dt

    from sqlalchemy import insert

    from orbit_tasks.db.platform_tables import archive_jobs
    from orbit_tasks.ids import new_id
    from orbit_tasks.platform import store

    day = dt.timedelta(days=1)
    t0 = dt.datetime(2026, 1, 10, 12, 0, 0, 123456)
    with platform_engine.begin() as conn:
        ns = store.create_namespace(conn, "ranges")
        other_ns = store.create_namespace(conn, "ranges-other")
        store.add_policy_revision(conn, ns, "tasks", 2 * 86400, "t")  # revision 1: 2 days
        store.add_policy_revision(conn, ns, "tasks", 5 * 86400, "t")  # revision 2: 5 days
        store.add_policy_revision(conn, ns, "events", 3600, "t")
        store.add_policy_revision(conn, other_ns, "tasks", 3600, "t")

    ids = sorted(new_id() for _ in range(2))  # two ids for a created_at tie, in id order

    def job(state: str, created: dt.datetime, policy: int = 1, **kw: Any) -> Any:
        values: dict[str, Any] = dict(
            namespace_id=ns,
            id=new_id(),
            kind="tasks",
            plan_revision=1,
            policy_revision=policy,
            storage_id=b"\x01" * 16,
            batch_size=10,
            max_bytes=1 << 20,
            state=state,
            created_at=created,
            updated_at=created,
        )
        values.update(kw)
        with platform_engine.begin() as conn:
            conn.execute(insert(archive_jobs).values(**values))
        with platform_engine.connect() as conn:
            found = job_store.get_job(conn, values["namespace_id"], values["id"])
        assert found is not None
        return found

    def rng(j: Any) -> ArchiveRange:
        with platform_engine.connect() as conn:
            return job_store.job_range(conn, j)

    first = job("SUCCEEDED", t0, policy=1)
    assert rng(first) == ArchiveRange(None, t0 - 2 * day)
    job("FAILED", t0 + day)  # neither FAILED ...
    job("ABANDONED", t0 + 2 * day)  # ... nor ABANDONED jobs count
    job("SUCCEEDED", t0 + 3 * day, kind="events")  # another kind
    job("SUCCEEDED", t0 + 3 * day, namespace_id=other_ns)  # another namespace
    cur = job("PENDING", t0 + 4 * day, policy=2)
    assert rng(cur) == ArchiveRange(t0 - 2 * day, t0 - day)  # until with cur's 5-day policy
    early = job("PENDING", t0 + 1.5 * day, policy=2)
    assert rng(early) == ArchiveRange(t0 - 2 * day, t0 - 3.5 * day) and rng(early).empty
    job("SUCCEEDED", t0 + 5 * day, policy=1)  # created after cur: not its predecessor
    assert rng(cur) == ArchiveRange(t0 - 2 * day, t0 - day)
    # A tie on created_at: the job with the smaller id is the one "created before".
    tie = t0 + 10 * day
    low = job("SUCCEEDED", tie, policy=2, id=ids[0])
    high = job("PENDING", tie, policy=1, id=ids[1])
    assert rng(high) == ArchiveRange(tie - 5 * day, tie - 2 * day)  # from: low's own policy
    assert rng(low) == ArchiveRange(t0 + 3 * day, tie - 5 * day)  # the job created at t0+5d
    job("SUCCEEDED", tie + day, policy=2)  # until tie - 4d: the greatest so far
    with platform_engine.begin() as conn:
        store.add_policy_revision(conn, ns, "tasks", 30 * 86400, "t")  # revision 3: 30 days
    job("SUCCEEDED", tie + 3 * day, policy=3)  # the latest success; its until is tie - 27d
    after_long = job("PENDING", tie + 4 * day, policy=1)  # from: not tie - 27d (roots twice)
    assert rng(after_long) == ArchiveRange(tie - 4 * day, tie + 2 * day)
    from orbit_tasks.archive.jobs import ErrorCode, JobFailure
    from orbit_tasks.db.platform_tables import archive_policies

    with platform_engine.begin() as conn:
        conn.execute(
            archive_policies.delete().where(
                archive_policies.c.namespace_id == ns, archive_policies.c.revision == 3
            )
        )
    with pytest.raises(JobFailure) as missing:
        rng(after_long)  # its own policy exists; an earlier success's is gone
    assert missing.value.code is ErrorCode.POLICY_MISSING
