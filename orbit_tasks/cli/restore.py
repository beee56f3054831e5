"""``orbit job restore`` and ``orbit archive restore`` (SPEC §9; docs/archive-format.md).

Both verify every chain first (exit 1 naming the first bad file, nothing written), then write
the archived rows into the same-named tables of ``--into``, one transaction per batch file.
Rows already present with identical values are skipped; rows present with other values are
conflicts: their batch is left unwritten, they are listed by key, and the exit code is 3.
``--into`` naming the live platform database is refused (exit 2) unless ``--into-source``.
Progress goes to stderr as a bar (``--json``: one JSON object per batch on stdout, then a
summary object).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

import click
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

from orbit_tasks.archive.engine.storage import Storage
from orbit_tasks.archive.format.values import format_ts
from orbit_tasks.archive.restore import run as engine_restore
from orbit_tasks.archive.restore import store as restore_store
from orbit_tasks.archive.restore.run import (
    EVERYTHING,
    BatchResult,
    JobArchive,
    JobResult,
    Window,
)
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.cli.common import json_option
from orbit_tasks.cli.places import open_place
from orbit_tasks.db.engine import engine_for_setting, parse_database_url
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.error_lines import describe_operational_error
from orbit_tasks.errors import InvalidInput, NotFound, OrbitError
from orbit_tasks.ids import from_hex
from orbit_tasks.platform.history import history_kind
from orbit_tasks.platform.store import resolve_namespace
from orbit_tasks.redaction import redact_url

SHOWN_CONFLICTS = 20
# The one connection charset of a MySQL/MariaDB target: archived text is UTF-8 with 4-byte
# characters, which any other charset cannot carry (or carries as "?").
TARGET_CHARSET = "utf8mb4"
INTO = "--into"


class TimestampParam(click.ParamType):
    """A UTC time: ``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM[:SS[.ffffff]]`` with optional ``Z``
    (an explicit offset is converted to UTC)."""

    name = "timestamp"

    def convert(self, value: Any, param: Any, ctx: Any) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            parsed = datetime.fromisoformat(str(value))
        except ValueError:
            self.fail(
                f"{value!r} is not a UTC timestamp "
                "(allowed: YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS[.ffffff][Z])",
                param,
                ctx,
            )
        if parsed.tzinfo is not None:
            parsed = parsed.astimezone(UTC).replace(tzinfo=None)
        return parsed


TIMESTAMP = TimestampParam()


def _into_options(fn: Any) -> Any:
    fn = click.option(
        "--into-source",
        is_flag=True,
        help="Allow --into to be the live platform database (restore deleted history in place).",
    )(fn)
    return click.option(
        "--into",
        "into",
        required=True,
        metavar="URL",
        help="Target database: mysql://USER@HOST/DB, mariadb://..., or sqlite:///FILE.",
    )(fn)


@click.command("restore")
@click.argument("ns")
@click.argument("job")
@click.option("--volume", required=True, help="Job's volume, or s3://BUCKET/PREFIX.")
@_into_options
@json_option
def job_restore(
    ns: str, job: str, volume: str, into: str, into_source: bool, as_json: bool
) -> None:
    """Verify a SUCCEEDED job's chain, then write its rows into the tables of --into."""
    check_target_url(into)
    platform = platform_engine()
    with platform.connect() as conn:
        namespace = resolve_namespace(conn, ns)
        j = job_store.require_job(conn, namespace.id, from_hex(job, "job id"))
    directory = engine_restore.job_directory(_volumes([volume]), j)
    target = _target(into, into_source, platform)
    archive = engine_restore.open_job(platform, j, directory)
    engine_restore.check_rows(archive)
    _run([archive], target, EVERYTHING, as_json, {})


@click.command("restore")
@click.argument("ns")
@click.argument("kind")
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    required=True,
    help="A volume or s3://BUCKET/PREFIX holding jobs of the window (repeatable).",
)
@_into_options
@click.option("--from", "from_", type=TIMESTAMP, default=None, help="Settled at or after (UTC).")
@click.option("--until", type=TIMESTAMP, default=None, help="Settled before (UTC).")
@click.option(
    "--skip-missing-volumes",
    is_flag=True,
    help="Restore the jobs on the given volumes and skip (and list) jobs on other storages.",
)
@json_option
def archive_restore(
    ns: str,
    kind: str,
    volumes: tuple[str, ...],
    into: str,
    into_source: bool,
    from_: datetime | None,
    until: datetime | None,
    skip_missing_volumes: bool,
    as_json: bool,
) -> None:
    """Restore every SUCCEEDED job of KIND whose range meets the window, in range order.

    Only roots whose settled time lies in [--from, --until) are written (with their children),
    so "March" gives March's rows even when a job's range starts in February."""
    window = Window(from_, until)
    history_kind(kind)
    check_target_url(into)
    platform = platform_engine()
    with platform.connect() as conn:
        namespace = resolve_namespace(conn, ns)
        selected = engine_restore.jobs_in_window(conn, namespace.id, kind, window)
    if not selected:
        raise NotFound(
            f"no SUCCEEDED {kind} job of namespace {namespace.name} covers the window "
            f"{_window_text(window)}; nothing was written"
        )
    mounted = _volumes(volumes)
    missing = [j for j, _ in selected if j.storage_id not in mounted]
    if missing and not skip_missing_volumes:
        storages = sorted({j.storage_id.hex() for j in missing})
        raise InvalidInput(
            f"{len(missing)} job(s) of the window are on storage {', '.join(storages)}, which no "
            "--volume gives; add a --volume for each, or --skip-missing-volumes; nothing written"
        )
    for j in missing:
        click.echo(
            f"skipped: job {j.id.hex()} is on storage {j.storage_id.hex()} (no --volume)", err=True
        )
    target = _target(into, into_source, platform)
    archives = []
    for j, _ in selected:
        if j.storage_id in mounted:
            archive = engine_restore.open_job(platform, j, engine_restore.job_directory(mounted, j))
            engine_restore.check_rows(archive)
            archives.append(archive)
    gaps = engine_restore.uncovered(window, [r for _, r in selected])
    for lo, hi in gaps:
        click.echo(f"warning: no SUCCEEDED job covers {_span_text(lo, hi)}", err=True)
    extra = {
        "window": {"from": _ts(window.from_), "until": _ts(window.until)},
        "uncovered": [{"from": _ts(lo), "until": _ts(hi)} for lo, hi in gaps],
        "skipped_jobs": [{"job_id": j.id.hex(), "storage_id": j.storage_id.hex()} for j in missing],
    }
    _run(archives, target, window, as_json, extra)


# --------------------------------------------------------------------------- helpers


def _ts(value: datetime | None) -> str | None:
    return None if value is None else format_ts(value)


def _span_text(lo: datetime | None, hi: datetime | None) -> str:
    return f"[{_ts(lo) or 'beginning'}, {_ts(hi) or 'now'})"


def _window_text(window: Window) -> str:
    return _span_text(window.from_, window.until)


def _volumes(paths: Any) -> dict[bytes, Storage]:
    """storage id -> storage, from each volume's identity (exit 2 when unreadable)."""
    out: dict[bytes, Storage] = {}
    with platform_engine().connect() as conn:
        for path in paths:
            opened = open_place(conn, path)
            out.setdefault(opened.identity.storage_id, opened.storage)
    return out


def check_target_url(url: str) -> URL:
    """``--into`` checked as ``ORBIT_DATABASE_URL`` is (scheme, port, database: one line naming
    ``--into`` and the URL, password hidden), and a MySQL/MariaDB target's ``charset`` must be
    utf8mb4 (:class:`InvalidInput`, before anything connects or is written)."""
    parsed = parse_database_url(url, INTO)
    charset = parsed.query.get("charset")
    if parsed.get_backend_name() != "sqlite" and charset is not None:
        values = [charset] if isinstance(charset, str) else list(charset)
        if any(v.lower() != TARGET_CHARSET for v in values):
            raise InvalidInput(
                f"{INTO} {redact_url(url)!r}: charset={','.join(values)} is not allowed "
                f"(allowed: charset={TARGET_CHARSET}, the default)"
            )
    return parsed


def _target(url: str, into_source: bool, platform: Engine) -> Engine:
    """The target engine (its errors name ``--into`` and the URL); refuses a bad URL and the
    live source database."""
    check_target_url(url)
    shown = f"{INTO} {redact_url(url)!r}"
    engine = engine_for_setting(INTO, url)
    restore_store.strict_sessions(engine)
    try:
        same = restore_store.same_database(platform, engine)
    except OperationalError as exc:
        code = getattr(exc.orig, "args", (None,))[0]
        if code == 1049:
            raise OrbitError(
                f"{shown}: the database does not exist; create it first "
                f"(CREATE DATABASE ... CHARACTER SET {TARGET_CHARSET})"
            ) from None
        raise OrbitError(f"{shown}: {describe_operational_error(exc)}") from None
    if same and not into_source:
        raise InvalidInput(
            f"{shown} is the live platform database (ORBIT_DATABASE_URL); refused. "
            "Add --into-source to restore deleted history in place"
        )
    if same:
        click.echo("note: restoring into the live platform database (--into-source)", err=True)
    return engine


class _Progress:
    """A bar on stderr (redrawn on a terminal, every 10 % otherwise), or JSON lines."""

    def __init__(self, total: int, as_json: bool) -> None:
        self.total, self.as_json, self.done, self.shown = total, as_json, 0, -1
        self.tty = sys.stderr.isatty()

    def batch(self, b: BatchResult) -> None:
        self.done += 1
        if self.as_json:
            line = {
                "event": "batch",
                "job_id": b.job_id,
                "seq": b.seq,
                "batches": b.batches,
                "roots": b.roots,
                "inserted": dict(b.inserted),
                "skipped": dict(b.skipped),
                "conflicts": len(b.conflicts),
                "done": self.done,
                "total": self.total,
            }
            click.echo(json.dumps(line, sort_keys=True))
            return
        step = 100 * self.done // max(self.total, 1)
        if not self.tty and step // 10 == self.shown // 10 and self.done < self.total:
            return
        self.shown = step
        width = 30
        fill = width * self.done // max(self.total, 1)
        bar = f"restore [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} batches"
        click.echo(("\r" + bar) if self.tty else bar, err=True, nl=not self.tty)

    def close(self) -> None:
        if self.tty and not self.as_json and self.done:
            click.echo("", err=True)


def _run(
    archives: list[JobArchive],
    target: Engine,
    window: Window,
    as_json: bool,
    extra: dict[str, Any],
) -> None:
    progress = _Progress(sum(len(a.batch_files) for a in archives), as_json)
    results: list[JobResult] = []
    try:
        for archive in archives:
            results.append(engine_restore.restore_job(target, archive, window, progress.batch))
    finally:
        progress.close()
        target.dispose()
    conflicts = [c for r in results for c in r.conflicts]
    inserted: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for r in results:
        for name, n in r.inserted.items():
            inserted[name] = inserted.get(name, 0) + n
        for name, n in r.skipped.items():
            skipped[name] = skipped.get(name, 0) + n
    summary = {
        "event": "summary",
        "ok": not conflicts,
        "target": target.url.render_as_string(hide_password=True),
        "jobs": [r.to_dict() for r in results],
        "roots": sum(r.roots for r in results),
        "inserted": inserted,
        "skipped": skipped,
        "conflicts": [c.to_dict() for c in conflicts],
        **extra,
    }
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        for r in results:
            click.echo(
                f"job {r.job_id} ({r.format}, {r.batches} batches): {r.roots} roots in the "
                f"target; inserted {_counts(r.inserted)}; already present {_counts(r.skipped)}"
            )
        for c in conflicts[:SHOWN_CONFLICTS]:
            click.echo(
                f"conflict: {c.table} {json.dumps(c.key, sort_keys=True)} differs in "
                f"{', '.join(c.columns)} (job {c.job_id} batch {c.seq} not written)"
            )
        if len(conflicts) > SHOWN_CONFLICTS:
            click.echo(f"... and {len(conflicts) - SHOWN_CONFLICTS} more conflicts (--json)")
    if conflicts:
        batches = len({(c.job_id, c.seq) for c in conflicts})
        click.echo(
            f"error: {len(conflicts)} row(s) differ in the target; "
            f"{batches} batch(es) were not written",
            err=True,
        )
        raise SystemExit(3)


def _counts(counter: Any) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "0"
