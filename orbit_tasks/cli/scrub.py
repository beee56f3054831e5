"""``orbit archive scrub [NS [JOB]] --volume ...``: one scrub now, in the foreground, by the
code the scheduled scrub runs (issue 28 item 3; ``engine/scrub.py``): the storage's lease, the
controls, the bounded read rate, the result recorded (an audit row when it did not verify).

Without JOB it re-verifies the jobs due on each ``--volume`` (of NS when given); with JOB that
one job, due or not. Exit 1 when a chain did not verify (the first bad file is named), 3 when
another scrub holds the storage or a control stops it, 4 for an unknown namespace or job."""

from __future__ import annotations

from typing import Any

import click

from orbit_tasks.archive.engine import scrub as scrubbing
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.scrubs import ScrubOutcome, ScrubStop
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.cli.common import emit, json_option
from orbit_tasks.cli.places import OpenedPlace, open_place
from orbit_tasks.db.engine import single_statements
from orbit_tasks.db.registry import platform_engine, source_engine
from orbit_tasks.errors import ConflictError, InvalidInput
from orbit_tasks.ids import from_hex
from orbit_tasks.platform.store import resolve_namespace
from orbit_tasks.settings import get_settings
from orbit_tasks.units import format_size

_REFUSED = {
    ScrubStop.BUSY: "another scrub holds storage {storage} ({holder}); nothing read",
    ScrubStop.PAUSED: "storage {storage}: a pause covers the next job's scope; it stays due",
    ScrubStop.WINDOW: "storage {storage}: outside a run window of the next job's scope",
    ScrubStop.DB_LOAD: "storage {storage}: the database is over its load guard",
    ScrubStop.LEASE_LOST: "storage {storage}: the scrub's lease was lost to another scrub",
}
_FAILED = {ScrubStop.IO_ERROR: "storage {storage} could not be read (I/O error); nothing recorded"}


def _line(r: dict[str, Any]) -> str:
    if r["outcome"] == ScrubOutcome.BAD.value:
        return f"BAD: job {r['job_id']}: {r['first_bad_file']} ({r['reason']})"
    rate = "" if r["bytes_per_second"] is None else f", {format_size(int(r['bytes_per_second']))}/s"
    word = "repaired" if r["outcome"] == ScrubOutcome.REPAIRED.value else "ok"
    return (
        f"{word}: job {r['job_id']} ({r['files_read']} files, {r['bytes_read']} bytes in "
        f"{r['seconds']:g}s{rate})"
    )


@click.command("scrub")
@click.argument("ns", required=False)
@click.argument("job", required=False)
@click.option(
    "--volume", "volumes", multiple=True, required=True,
    help="A storage to scrub: its folder or s3://BUCKET/PREFIX (repeatable).",
)  # fmt: skip
@json_option
def archive_scrub(ns: str | None, job: str | None, volumes: tuple[str, ...], as_json: bool) -> None:
    """Re-verify now, at the scrub's read rate: the due jobs on each --volume (of NS), or JOB."""
    settings = get_settings()
    engine = platform_engine()
    job_id = None if job is None else from_hex(job, "job id")
    with engine.connect() as conn:
        ns_id = None if ns is None else resolve_namespace(conn, ns).id
        target = None
        if job_id is not None:
            assert ns_id is not None
            target = job_store.require_job(conn, ns_id, job_id)
        conn.rollback()
    opened: list[OpenedPlace] = []
    for given in volumes:
        # statements that commit by themselves: the S3 identity read after the registry's
        # answer may outlast the idle-transaction bound (a quarter of the lease)
        with engine.connect() as conn:
            opened.append(open_place(single_statements(conn), given))
    if target is not None:
        if target.state is not JobState.SUCCEEDED:
            raise ConflictError(
                f"job {target.id.hex()} is {target.state.value}: only SUCCEEDED jobs are "
                "scrubbed (`orbit job verify` checks any job)"
            )
        opened = [o for o in opened if o.identity.storage_id == target.storage_id]
        if not opened:
            raise InvalidInput(
                f"--volume {', '.join(volumes)} does not hold storage "
                f"{target.storage_id.hex()} of job {target.id.hex()}"
            )
    seen: set[bytes] = set()
    reports = []
    for o in opened:
        storage_id = o.identity.storage_id
        if storage_id in seen:
            continue
        seen.add(storage_id)
        reports.append(
            scrubbing.scrub_storage(
                engine,
                storage_id,
                o.storage,
                settings,
                namespace_id=ns_id,
                job_id=job_id,
                source_engine=source_engine(),
                actor=settings.operator,
            )  # fmt: skip
        )
    results = [r.as_dict() for rep in reports for r in rep.results]
    stops = [
        {"storage_id": rep.storage_id.hex(), "stop": rep.stop.value, "holder": rep.holder}
        for rep in reports
    ]
    bad = sum(r["outcome"] == ScrubOutcome.BAD.value for r in results)
    refused = [rep for rep in reports if rep.stop in _REFUSED]
    lines = [_line(r) for r in results]
    for rep in refused:
        lines.append(
            "refused: "
            + _REFUSED[rep.stop].format(storage=rep.storage_id.hex(), holder=rep.holder or "?")
        )
    unreadable = [rep for rep in reports if rep.stop in _FAILED]
    for rep in unreadable:
        lines.append("failed: " + _FAILED[rep.stop].format(storage=rep.storage_id.hex()))
    off = [rep for rep in reports if rep.stop is ScrubStop.OFF]
    if off:
        lines.append("scheduled scrub is off (ORBIT_ARCHIVE_SCRUB_DAYS=0): nothing is due")
    elif not results and not refused and not unreadable:
        lines.append("ok: nothing due")
    emit(
        {
            "ok": not bad and not refused and not unreadable, "results": results,
            "storages": stops, "failed": bad,
        },
        as_json, "\n".join(lines),
    )  # fmt: skip
    if bad or unreadable:
        raise SystemExit(1)
    if refused:
        raise SystemExit(3)
