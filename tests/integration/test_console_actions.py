"""The operator console's actions and job pages (issue 29 items 2, 3) over real HTTP against
``orbit console serve`` on MariaDB: retry with a larger budget and abandon a job (the CLI's
store calls, with its refusals and the revision the page showed), run a plan now, the job's
JSON, the jobs list's filters and keyset pages, each action audited under the signed-in
person and the page showing what the database returned."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select, update

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.business_tables import sender_outbox, sender_resolutions
from orbit_tasks.db.engine import db_now, make_engine
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_jobs, archive_plans
from tests.support.archive_jobs import ArchiveEnv, create_job, make_namespace
from tests.support.browser import until
from tests.support.console import Console, add_people, csrf_of, orbit, running_console, sign_in
from tests.support.scene import archive_scene

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]
J = archive_jobs.c


@pytest.fixture
def console(ae: ArchiveEnv, tmp_path: object) -> Iterator[Console]:
    assert orbit(ae.env, "sender", "db", "upgrade").returncode == 0
    add_people(ae.env)
    with running_console({**ae.env, "ORBIT_METRICS_CACHE_SECONDS": "1"}) as running:
        yield running


def _post(client: httpx.Client, path: str, **form: str) -> httpx.Response:
    token = csrf_of(client.get("/").text)
    return client.post(path, data={"csrf": token, **form})


def _actors(ae: ArchiveEnv, action: str) -> list[str]:
    with ae.engine.connect() as conn:
        q = select(audit_events.c.actor).where(audit_events.c.action == action)
        return [r.actor for r in conn.execute(q)]


def test_retry_abandon_and_run_a_plan_from_the_console(
    ae: ArchiveEnv, console: Console, tmp_path: object
) -> None:
    scene = archive_scene(ae.engine, name="acme", volume=ae.tmp / "vol", kind="tasks", roots=10)
    job = create_job(ae, scene.ns, "tasks")  # PENDING; no worker runs it
    with ae.engine.begin() as conn:  # as a worker's failure leaves it
        conn.execute(
            update(archive_jobs)
            .where(J.namespace_id == scene.ns, J.id == job.id)
            .values(state="FAILED", error_code="IO_ERROR", revision=J.revision + 1)
        )
    failed = ae.job(scene.ns, job.id)
    operator = sign_in(console.base_url, "operator")
    # the exporter's snapshot (refreshed every ORBIT_METRICS_CACHE_SECONDS): the storage and
    # the FAILED job by code
    row = '<td>IO_ERROR</td><td>1</td><td><a href="/runbook#io_error">'

    def fleet_with_the_row() -> str | None:
        text = operator.get("/").text
        return text if row in text else None

    fleet = until(fleet_with_the_row, 30, "the FAILED job on the fleet page")
    assert "(no label)" in fleet and "folder" in fleet
    page = operator.get(f"/jobs/acme/{job.id.hex()}")
    assert page.status_code == 200
    assert "FAILED (IO_ERROR)" in page.text and 'href="/runbook#io_error"' in page.text
    data = operator.get(f"/api/jobs/acme/{job.id.hex()}").json()
    assert data["state"] == "FAILED" and data["fields"]["attempts"] == str(failed.attempts)

    base = f"/jobs/acme/{job.id.hex()}"
    smaller = _post(
        operator, base + "/retry", max_bytes="1MiB", expect_revision=str(failed.revision)
    )
    assert smaller.status_code == 400 and "error:" in smaller.text
    stale = _post(operator, base + "/retry", expect_revision=str(failed.revision - 1))
    assert stale.status_code == 409
    bad = _post(operator, base + "/retry", max_bytes="lots")
    assert bad.status_code == 400 and "lots" in bad.text
    assert ae.job(scene.ns, job.id).state is JobState.FAILED  # nothing written by the refusals
    retried = _post(
        operator, base + "/retry", max_bytes="128MiB", expect_revision=str(failed.revision)
    )
    after = ae.job(scene.ns, job.id)
    assert retried.status_code == 200, retried.text[:1000]
    assert after.state is JobState.PENDING and after.max_bytes == 128 * 1024 * 1024
    assert f"is PENDING (revision {after.revision}, max_bytes {after.max_bytes})" in retried.text
    assert _actors(ae, "archive.job.retry") == ["operator"]

    gone = _post(operator, base + "/abandon", expect_revision=str(after.revision))
    assert gone.status_code == 200 and "is ABANDONED" in gone.text
    assert ae.job(scene.ns, job.id).state is JobState.ABANDONED
    assert _actors(ae, "archive.job.abandon") == ["operator"]
    again = _post(operator, base + "/abandon")
    assert again.status_code == 409  # the CLI's refusal: already ABANDONED

    with ae.engine.connect() as conn:
        before = conn.execute(select(archive_plans.c.next_run_at)).scalar_one()
    run = _post(operator, "/plans/acme/tasks/run")
    assert run.status_code == 200 and "plan acme/tasks is due now" in run.text
    assert _actors(ae, "archive.plan.run") == ["operator"]
    with ae.engine.connect() as conn:
        assert conn.execute(select(archive_plans.c.next_run_at)).scalar_one() <= before
    unknown = _post(operator, "/plans/acme/nokind/run")
    assert unknown.status_code == 400 and "nokind" in unknown.text

    history = operator.get(base).text  # the job's audit history
    assert "archive.job.retry" in history and "archive.job.abandon" in history


def test_jobs_list_filters_and_keyset_pages(ae: ArchiveEnv, console: Console) -> None:
    scene = archive_scene(ae.engine, name="acme", volume=ae.tmp / "vol", kind="tasks", roots=5)
    first = create_job(ae, scene.ns, "tasks")
    with ae.engine.begin() as conn:  # 60 more jobs of the namespace, as ticks would leave them
        rows = conn.execute(select(archive_jobs)).mappings().one()
        conn.execute(
            archive_jobs.insert(),
            [
                {**rows, "id": bytes.fromhex(f"{i + 1:032x}"), "state": "SUCCEEDED",
                 "kind": "events" if i % 2 else "tasks", "lease_id": None, "lease_until": None}
                for i in range(60)
            ],
        )  # fmt: skip
    viewer = sign_in(console.base_url, "viewer")
    page = viewer.get("/jobs", params={"namespace": "acme"})
    assert page.status_code == 200 and page.text.count('href="/jobs/acme/') == 50
    nxt = page.text.split("after=")[1].split('"')[0]
    second = viewer.get("/jobs", params={"namespace": "acme", "after": nxt})
    assert second.text.count('href="/jobs/acme/') == 11 and "last page" in second.text
    events = viewer.get("/jobs", params={"namespace": "acme", "kind": "events"})
    assert events.text.count('href="/jobs/acme/') == 30
    pending = viewer.get("/jobs", params={"namespace": "acme", "state": "PENDING"})
    assert pending.text.count('href="/jobs/acme/') == 1 and first.id.hex() in pending.text
    bad = viewer.get("/jobs", params={"namespace": "acme", "after": "garbage!"})
    assert bad.status_code == 400
    assert viewer.get("/jobs", params={"namespace": "nobody"}).status_code == 404
    assert viewer.get("/jobs", params={"namespace": "acme", "state": "DONE"}).status_code == 400


def _review_rows(url: str, ns: str, count: int) -> list[str]:
    """``count`` REVIEW rows (last code REJECTED) of ``ns``, as a sender leaves them."""
    engine = make_engine(url)
    digest = hashlib.sha256(b"{}").digest()
    ops = [secrets.token_hex(16) for _ in range(count)]
    try:
        with engine.begin() as conn:
            now = db_now(conn)
            conn.execute(
                sender_outbox.insert(),
                [
                    dict(namespace_id=ns, queue_id="ab" * 16, operation_id=op,
                         idempotency_key="op-" + op, request_json="{}", request_digest=digest,
                         state="REVIEW", send_count=1, lease_epoch=1, wake_at=None,
                         send_deadline_at=now + dt.timedelta(hours=20), last_code="REJECTED",
                         created_at=now - dt.timedelta(hours=1), updated_at=now)
                    for op in ops
                ],
            )  # fmt: skip
    finally:
        engine.dispose()
    return ops


def test_dead_letters_resolved_in_bulk_after_a_preview(ae: ArchiveEnv, console: Console) -> None:
    ns, _queue = make_namespace(ae.engine, "acme")
    ops = _review_rows(ae.env["ORBIT_SENDER_DATABASE_URL"], ns.hex(), 3)
    operator = sign_in(console.base_url, "operator")
    listed = operator.get("/dead-letters", params={"code": "REJECTED", "namespace": "acme"})
    assert listed.status_code == 200 and all(op in listed.text for op in ops)
    no_reason = _post(operator, "/dead-letters/preview", action="resolve", code="REJECTED")
    assert no_reason.status_code == 400 and "error:" in no_reason.text
    bad_code = _post(operator, "/dead-letters/preview", action="requeue", code="NOPE")
    assert bad_code.status_code == 400 and "NOPE" in bad_code.text
    preview = _post(
        operator, "/dead-letters/preview", action="resolve", code="REJECTED", namespace="acme",
        reason="re-created by hand",
    )  # fmt: skip
    assert "dry run: 3 would_resolve; nothing changed" in preview.text
    done = _post(
        operator, "/dead-letters/resolve", code="REJECTED", namespace="acme",
        reason="re-created by hand",
    )  # fmt: skip
    assert done.status_code == 200 and "3 resolved" in done.text
    engine = make_engine(ae.env["ORBIT_SENDER_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            who = {r.resolved_by for r in conn.execute(select(sender_resolutions))}
    finally:
        engine.dispose()
    assert who == {"operator"}
    assert _actors(ae, "sender.resolve.code") == ["operator"]
    # resolved rows are refused by a bulk requeue, as by the CLI's
    refused = _post(operator, "/dead-letters/preview", action="requeue", code="REJECTED")
    assert "3 refused" in refused.text and "resolved by operator" in refused.text


def test_a_scrub_failure_is_on_the_fleet_page(ae: ArchiveEnv, console: Console) -> None:
    """Issue 29 item 1 ("scrub failures when they exist"): a job whose files no longer verify,
    found by `orbit archive scrub`, is on the fleet page under what needs a person, with its
    storage and the runbook section; before the scrub there is none."""
    from tests.support.scene import deliver

    scene = archive_scene(ae.engine, name="rot", volume=ae.tmp / "vol", kind="tasks", roots=10)
    job = create_job(ae, scene.ns, "tasks")
    places = {scene.storage.hex(): scene.volume}
    for _ in range(50):
        if deliver(job, places, ae.settings, engine=ae.engine) == "succeeded":
            break
    assert ae.job(scene.ns, job.id).state is JobState.SUCCEEDED
    viewer = sign_in(console.base_url, "viewer")
    assert "no scrub failure" in until(lambda: viewer.get("/").text or None, 30, "the fleet")
    (batch,) = scene.volume.rglob("00000001-*.jsonl.gz")
    data = bytearray(batch.read_bytes())
    data[len(data) // 2] ^= 0x01
    batch.write_bytes(bytes(data))
    scrub = ae.orbit("archive", "scrub", "rot", job.id.hex(), "--volume", str(scene.volume),
                     check=False)  # fmt: skip
    assert scrub.returncode == 1 and batch.name in scrub.stderr, scrub.stderr

    def with_the_failure() -> str | None:
        text = viewer.get("/").text
        return (
            text
            if "jobs that failed their scrub" in text and "no scrub failure" not in text
            else None
        )

    fleet = until(with_the_failure, 30, "the scrub failure on the fleet page")
    section = fleet.split("Scrub failures", 1)[1]
    assert scene.storage.hex() in section and 'href="/runbook#orbitarchivescrubfailed"' in section
