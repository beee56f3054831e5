"""``orbit job list|show|watch|retry|abandon|verify|repair|export`` (SPEC §5, §9).

``retry`` and ``abandon`` run in one transaction with an audit row naming the actor
(``ORBIT_ACTOR``, else ``$USER``) and accept ``--expect-revision`` (exit 3 when stale). A retry
with a ``--max-bytes`` lower than the job's budget is refused with exit 2 (invalid input) and
nothing is written. ``verify`` exits 1 naming the first bad file; ``repair`` (issue 24) rebuilds
missing or corrupt files from the source, audited, and exits 1 naming a file it cannot rebuild
identically.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import click

from orbit_tasks.archive import claims
from orbit_tasks.archive import controls as control_rules
from orbit_tasks.archive.engine.storage import JobFiles
from orbit_tasks.archive.engine.verify import export_roots, verify_job_dir
from orbit_tasks.archive.format.expectation import ChainExpectation
from orbit_tasks.archive.jobs import Job, JobFailure, JobState, check_repair
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import controls as control_store
from orbit_tasks.archive.store import jobs as store
from orbit_tasks.archive.store import source
from orbit_tasks.archive.wakeups import publish_wakeup
from orbit_tasks.cli.common import (
    SIZE,
    DurationParam,
    IntegerParam,
    LazyGroup,
    WordChoice,
    emit,
    emit_list,
    iso_utc,
    json_option,
)
from orbit_tasks.cli.places import open_place
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.registry import platform_engine, source_engine
from orbit_tasks.errors import OrbitError
from orbit_tasks.ids import from_hex
from orbit_tasks.logs import log_action
from orbit_tasks.platform.store import resolve_namespace
from orbit_tasks.settings import get_settings
from orbit_tasks.timestamps import format_optional, format_ts
from orbit_tasks.units import format_size

log = logging.getLogger("orbit.cli.job")

STATES = [s.value for s in JobState]


@click.group("job", cls=LazyGroup, lazy={"restore": "orbit_tasks.cli.restore:job_restore"})
def job_group() -> None:
    """Archive jobs: inspect, follow, retry, abandon, verify, repair and export."""


def _load(ns: str, job: str) -> tuple[bytes, Job]:
    with platform_engine().connect() as conn:
        namespace = resolve_namespace(conn, ns)
        return namespace.id, store.require_job(conn, namespace.id, from_hex(job, "job id"))


def _statistics(j: Job) -> dict[str, Any]:
    """Elapsed time (created to now, or to the last change of a finished job), roots/s over
    it, and the seconds waited by reason (an open wait counts while the job is PENDING)."""
    with platform_engine().connect() as conn:
        now = db_now(conn)
        rows = control_store.job_waits(conn, j.namespace_id, j.id)
    final = j.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.ABANDONED)
    end = j.updated_at if final else now
    elapsed = max(0.0, (end - j.created_at).total_seconds())
    totals = control_rules.wait_totals(rows, now, open_counts=j.state is JobState.PENDING)
    rate = control_rules.roots_per_second(j.roots, elapsed)
    return {
        "elapsed_seconds": round(elapsed, 3),
        "roots_per_second": None if rate is None else round(rate, 1),
        "waited_seconds": {r.value: round(v, 3) for r, v in totals.seconds.items()},
        "waiting": None if totals.waiting is None else totals.waiting.value,
        "waiting_since": iso_utc(totals.waiting_since),
    }


def _statistics_text(st: dict[str, Any]) -> list[tuple[str, Any]]:
    waited = ", ".join(f"{r} {v:g}s" for r, v in st["waited_seconds"].items() if v) or "none"
    waiting = st["waiting"] or "-"
    if st["waiting"]:
        waiting += f" (since {st['waiting_since']})"
    rate = "-" if st["roots_per_second"] is None else f"{st['roots_per_second']:g}"
    return [
        ("elapsed", f"{st['elapsed_seconds']:g}s"),
        ("roots/s", rate),
        ("waited", waited),
        ("waiting", waiting),
    ]


def _range_view(job: Job) -> dict[str, Any] | None:
    with platform_engine().connect() as conn:
        try:
            rng = store.job_range(conn, job)
        except JobFailure:
            return None
        cut = _range_cut(conn, job)
    view: dict[str, Any] = {
        "from": format_optional(rng.from_),
        "until": format_ts(rng.until),
    }
    if rng.from_id is not None:  # a key bound (settled, id): SPEC §5 budget-sized ranges
        view["from_id"] = rng.from_id.hex()
    if rng.until_id is not None:
        view["until_id"] = rng.until_id.hex()
    if cut is not None:
        view["cut"] = cut
    return view


def _range_cut(conn: Any, job: Job) -> dict[str, Any] | None:
    """When the job's range was cut short to fit its budget (SPEC §5 budget-sized ranges):
    ``{"until", "policy_until", "reason"}`` from its recorded end (``orbit_archive_job_ends``);
    None when it was not cut or has no recorded end yet."""
    end = store.recorded_end(conn, job.namespace_id, job.id)
    if end is None or not end.cut:
        return None
    per_root = end.sample_bytes / end.sample_roots if end.sample_roots else 0.0
    return {
        "until": format_ts(end.end[0]),
        "policy_until": format_ts(end.policy_until),
        "reason": (
            f"budget: {end.roots_total} roots fit max_bytes {job.max_bytes} at "
            f"{per_root:.0f} bytes per root measured on {end.sample_roots} roots"
        ),
    }


@job_group.command("list")
@click.argument("ns")
@click.option("--state", type=WordChoice(STATES), default=None, help="Only jobs in this state.")
@click.option("--limit", type=IntegerParam(1, 1000), default=50, show_default=True)
@click.option("--after", "after", default=None, help="Cursor printed by a previous page.")
@json_option
def job_list(ns: str, state: str | None, limit: int, after: str | None, as_json: bool) -> None:
    """Jobs of a namespace, oldest first (keyset pages)."""
    with platform_engine().connect() as conn:
        namespace = resolve_namespace(conn, ns)
        jobs, nxt = store.list_jobs(
            conn,
            namespace.id,
            state=None if state is None else JobState(state),
            limit=limit,
            after=after,
        )
    emit_list(
        [j.as_dict() for j in jobs],
        as_json,
        [
            "id",
            "kind",
            "state",
            "error_code",
            "attempts",
            "batches",
            "roots",
            "bytes",
            "created_at",
        ],
        next_cursor=nxt,
    )


@job_group.command("show")
@click.argument("ns")
@click.argument("job")
@json_option
def job_show(ns: str, job: str, as_json: bool) -> None:
    """One job with its counters and fixed range."""
    _, j = _load(ns, job)
    data = j.as_dict()
    data["range"] = _range_view(j)
    data["statistics"] = _statistics(j)
    emit(data, as_json, _show_text)


def _show_text(data: dict[str, Any]) -> str:
    rng = data["range"]
    state = data["state"] + (f" ({data['error_code']})" if data["error_code"] else "")
    rows = [
        ("job", data["id"]),
        ("namespace_id", data["namespace_id"]),
        ("kind", data["kind"]),
        ("state", state),
        ("revision", data["revision"]),
        ("attempts", data["attempts"]),
        ("storage_id", data["storage_id"]),
        ("plan_revision", data["plan_revision"]),
        ("policy_revision", data["policy_revision"]),
        ("range", _range_text(rng)),
        ("batch_size", data["batch_size"]),
        ("max_bytes", f"{format_size(data['max_bytes'])} ({data['max_bytes']})"),
        ("batches", data["batches"]),
        ("roots", data["roots"]),
        ("bytes", data["bytes"]),
        ("last_sha256", data["last_sha256"] or "-"),
        ("lease_until", data["lease_until"] or "-"),
        ("created_at", data["created_at"]),
        ("updated_at", data["updated_at"]),
        *_statistics_text(data["statistics"]),
    ]
    return "\n".join(f"{key:<16}{value}" for key, value in rows)


def _range_text(rng: dict[str, Any] | None) -> str:
    if rng is None:
        return "-"
    text = f"{rng['from'] or '(start)'} .. {rng['until']}"
    cut = rng.get("cut")
    if cut is not None:
        text += f"  (cut short at {cut['until']}: {cut['reason']})"
    return text


@job_group.command("watch")
@click.argument("ns")
@click.argument("job")
@click.option(
    "--interval",
    type=DurationParam(1, 60),
    default="1s",
    show_default=True,
    help="How often to look (1s..60s).",
)
@click.option(
    "--timeout",
    type=DurationParam(1, 30 * 86400),
    default=None,
    help="Give up after this long (1s..30d, e.g. 10m).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per change (the job as in `job show --json`, plus total_roots).",
)
def job_watch(ns: str, job: str, interval: int, timeout: int | None, as_json: bool) -> None:
    """Follow a job's progress until it is SUCCEEDED, FAILED or ABANDONED.

    Prints a line (``--json``: an object, line-delimited) whenever the state or the counters
    change. Exit 0 on SUCCEEDED, 1 on FAILED or ABANDONED (or on --timeout)."""
    ns_id, j = _load(ns, job)
    with platform_engine().connect() as conn:
        try:
            rng: ArchiveRange | None = store.job_range(conn, j)
        except JobFailure:
            rng = None
    total: int | None = None
    if rng is not None:  # counted where the archive reads history (a replica when one is set)
        with source_engine().connect() as conn:
            total = source.count_roots(conn, j.kind, ns_id, rng)
    started = time.monotonic()
    last = None
    while True:
        with platform_engine().connect() as conn:
            j = store.require_job(conn, ns_id, j.id)
        st = _statistics(j)
        seen = (j.state, j.error_code, j.revision, j.attempts, j.batches, j.roots, j.bytes,
                st["waiting"])  # fmt: skip
        if seen != last:
            if as_json:
                emit({**j.as_dict(), "total_roots": total, "statistics": st}, True)
            else:
                click.echo(_progress(j, total, st))
            last = seen
        if j.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.ABANDONED):
            raise SystemExit(0 if j.state is JobState.SUCCEEDED else 1)
        if timeout is not None and time.monotonic() - started > timeout:
            click.echo("error: --timeout reached while the job is still running", err=True)
            raise SystemExit(1)
        time.sleep(interval)


def _progress(j: Job, total: int | None, st: dict[str, Any]) -> str:
    width = 30
    if total:
        done = min(width, int(width * j.roots / total))
        bar = "[" + "#" * done + "." * (width - done) + f"] {j.roots}/{total} roots"
    else:
        bar = f"{j.roots} roots" + ("" if total is None else "/0")
    err = f" {j.error_code}" if j.error_code else ""
    rate = "-" if st["roots_per_second"] is None else f"{st['roots_per_second']:g}"
    waiting = f" waiting={st['waiting']}" if st["waiting"] else ""
    return (
        f"{j.state.value}{err} {bar} batches={j.batches} bytes={j.bytes} attempts={j.attempts} "
        f"elapsed={st['elapsed_seconds']:g}s roots/s={rate}{waiting}"
    )


@job_group.command("retry")
@click.argument("ns")
@click.argument("job")
@click.option("--max-bytes", type=SIZE, default=None, help="Raise the budget (never lower).")
@click.option("--expect-revision", type=IntegerParam(), default=None, help="Compare-and-set guard.")
@json_option
def job_retry(
    ns: str, job: str, max_bytes: int | None, expect_revision: int | None, as_json: bool
) -> None:
    """FAILED -> PENDING (error code cleared); resumes from the confirmed prefix."""
    ns_id, j = _load(ns, job)
    settings = get_settings()
    after = store.retry(
        platform_engine(),
        ns_id,
        j.id,
        actor=settings.actor,
        max_bytes=max_bytes,
        expect_revision=expect_revision,
    )
    log_action(
        log, "archive.job.retried", namespace_id=ns_id, job_id=j.id, max_bytes=after.max_bytes
    )
    _wake(after)
    emit(after.as_dict(), as_json, f"job {after.id.hex()} is PENDING (revision {after.revision})")


@job_group.command("abandon")
@click.argument("ns")
@click.argument("job")
@click.option("--expect-revision", type=IntegerParam(), default=None, help="Compare-and-set guard.")
@json_option
def job_abandon(ns: str, job: str, expect_revision: int | None, as_json: bool) -> None:
    """FAILED, PENDING or expired RUNNING -> ABANDONED; files stay on the volume."""
    ns_id, j = _load(ns, job)
    after = store.abandon(
        platform_engine(), ns_id, j.id, actor=get_settings().actor, expect_revision=expect_revision
    )
    log_action(log, "archive.job.abandoned", namespace_id=ns_id, job_id=j.id)
    emit(after.as_dict(), as_json, f"job {after.id.hex()} is ABANDONED (revision {after.revision})")


def _wake(j: Job) -> None:
    """Best effort: the next tick's sweep publishes the wake-up anyway."""
    try:
        publish_wakeup(j.storage_id, j.namespace_id, j.id, kind=j.kind)
    except Exception as exc:  # broker unavailable
        log_action(log, "archive.job.wakeup_failed", logging.WARNING, error=type(exc).__name__)


def _job_volume(j: Job, volume: str) -> JobFiles:
    """The job's directory on ``--volume`` (a folder or s3://BUCKET/PREFIX)."""
    with platform_engine().connect() as conn:
        opened = open_place(conn, volume)
    return opened.job(j)


def _expectation(j: Job) -> ChainExpectation:
    with platform_engine().connect() as conn:
        try:
            rng: ArchiveRange | None = store.job_range(conn, j)
        except JobFailure:
            rng = None
    expect = claims.chain_expectation(j, complete=j.state is JobState.SUCCEEDED)
    return expect if rng is None else claims.with_range(expect, rng)


@job_group.command("verify")
@click.argument("ns")
@click.argument("job")
@click.option("--volume", required=True, help="The job's volume, or s3://BUCKET/PREFIX.")
@json_option
def job_verify(ns: str, job: str, volume: str, as_json: bool) -> None:
    """Full chain check of a job's files against its row; exit 1 names the first bad file."""
    _, j = _load(ns, job)
    directory = _job_volume(j, volume)
    report = verify_job_dir(directory, _expectation(j))
    data = {
        "ok": report.ok,
        "job_id": j.id.hex(),
        "state": j.state.value,
        "first_bad_file": report.first_bad_file,
        "reason": report.reason,
        "batches": report.batches,
        "roots": report.roots,
        "bytes": report.bytes,
        "final": report.final,
    }
    if report.ok:
        emit(
            data,
            as_json,
            f"ok: {report.batches} batches, {report.roots} roots, {report.bytes} bytes",
        )
        return
    emit(data, as_json, f"BAD: {report.first_bad_file}: {report.reason}")
    raise SystemExit(1)


@job_group.command("repair")
@click.argument("ns")
@click.argument("job")
@click.option("--volume", required=True, help="The job's volume, or s3://BUCKET/PREFIX.")
@click.option("--dry-run", is_flag=True, help="List what would be rebuilt; write nothing.")
@json_option
def job_repair(ns: str, job: str, volume: str, dry_run: bool, as_json: bool) -> None:
    """Rebuild missing or corrupt files from the source rows, kept only when they hash to the
    chain's links; exit 1 names a file that cannot be rebuilt identically."""
    # Imported here: only `job repair` pays for the read-ahead and the manifest builder.
    from orbit_tasks.archive.engine import repair

    ns_id, j = _load(ns, job)
    check_repair(j.state)
    directory = _job_volume(j, volume)
    with platform_engine().connect() as conn:
        try:
            rng = store.job_range(conn, j)
        except JobFailure as failure:
            raise OrbitError(
                f"job {j.id.hex()}: its range cannot be derived ({failure.code.value}); "
                "nothing to rebuild from"
            ) from None
    report = repair.repair_job(directory, j, rng, source_engine(), dry_run=dry_run)
    files = [f.as_dict() for f in report.files]
    if report.files and not dry_run:
        store.record_repair(
            platform_engine(), ns_id, j.id, actor=get_settings().actor,
            detail={
                "state": j.state.value, "batches": j.batches,
                "rebuilt": [f.seq for f in report.files if f.action == repair.REBUILT],
                "not_rebuilt": [f.seq for f in report.files if f.action == repair.NOT_REBUILT],
            },
        )  # fmt: skip
        log_action(
            log, "archive.job.repaired", namespace_id=ns_id, job_id=j.id, files=len(files),
            ok=report.ok,
        )  # fmt: skip
    data = {
        "ok": report.ok, "job_id": j.id.hex(), "state": j.state.value, "dry_run": dry_run,
        "checked": report.checked, "files": files, "reason": report.reason,
    }  # fmt: skip
    lines = [f"{f.action}: {f.name} ({f.found})" for f in report.files]
    if not report.ok:
        lines.append(f"not rebuilt: {report.reason}; left untouched")
    elif not report.files:
        lines.append(f"ok: nothing to repair ({report.checked} files checked)")
    elif j.state is JobState.FAILED and not dry_run:
        lines.append(f"repaired; run `orbit job retry {ns} {j.id.hex()}` to finish the job")
    emit(data, as_json, "\n".join(lines))
    if not report.ok:
        raise SystemExit(1)


@job_group.command("export")
@click.argument("ns")
@click.argument("job")
@click.option("--volume", required=True, help="The job's volume, or s3://BUCKET/PREFIX.")
def job_export(ns: str, job: str, volume: str) -> None:
    """Decoded roots with their children as JSON lines (the chain is verified first)."""
    _, j = _load(ns, job)
    directory = _job_volume(j, volume)
    for obj in export_roots(directory, _expectation(j)):
        click.echo(json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")))


def register(cli: click.Group) -> None:
    cli.add_command(job_group)
