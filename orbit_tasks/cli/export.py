"""``orbit archive export`` and ``orbit archive roots`` (issue 28 items 4 and 1): the roots
archived in a settled window across the SUCCEEDED jobs of a kind, every file verified while it
is read (orbit_tasks/archive/restore/window.py); export writes them to one file (JSON lines or
Parquet), roots lists where each one is.

A bad file is exit 1 naming the job and the file, and nothing is written (the export's temp
file is removed); an existing ``--out`` is exit 3 unless ``--force``.
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from orbit_tasks.archive.restore.export import ExportFormat, export_window
from orbit_tasks.archive.restore.run import uncovered
from orbit_tasks.archive.restore.window import WindowRead, list_roots, settled_window
from orbit_tasks.cli.common import json_option
from orbit_tasks.cli.restore import TIMESTAMP, _volumes
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.platform.history import history_kind
from orbit_tasks.platform.store import resolve_namespace
from orbit_tasks.timestamps import format_optional

ROOT_COLUMNS = ["settled", "id", "job_id", "seq", "file"]
SPOOL_BYTES = 1024 * 1024  # copied to stdout a chunk at a time


def _window_options(fn: Any) -> Any:
    fn = click.option(
        "--settled-until", "settled_until", type=TIMESTAMP, default=None,
        help="Roots settled before this time (UTC); open when left out.",
    )(fn)  # fmt: skip
    fn = click.option(
        "--settled-from", "settled_from", type=TIMESTAMP, default=None,
        help="Roots settled at or after this time (UTC); open when left out.",
    )(fn)  # fmt: skip
    return click.option(
        "--volume", "volumes", multiple=True, required=True,
        help="A volume or s3://BUCKET/PREFIX holding jobs of the window (repeatable).",
    )(fn)  # fmt: skip


def _open(ns: str, kind: str, settled_from: datetime | None, settled_until: datetime | None,
          volumes: tuple[str, ...]) -> tuple[Any, ...]:  # fmt: skip
    window = settled_window(settled_from, settled_until)
    history_kind(kind)
    with platform_engine().connect() as conn:
        namespace = resolve_namespace(conn, ns)
    return window, namespace, _volumes(volumes)


def _warn_uncovered(read: WindowRead) -> list[dict[str, str | None]]:
    gaps = uncovered(read.window, [wj.range for wj in read.jobs])
    for lo, hi in gaps:
        click.echo(
            f"warning: no SUCCEEDED job covers [{format_optional(lo) or 'beginning'}, "
            f"{format_optional(hi) or 'now'})",
            err=True,
        )
    return [{"from": format_optional(lo), "until": format_optional(hi)} for lo, hi in gaps]


@click.command("export")
@click.argument("ns")
@click.argument("kind")
@_window_options
@click.option(
    "--format", "fmt", type=click.Choice([f.value for f in ExportFormat]), required=True,
    help="jsonl: the root lines as archived; parquet: typed columns (needs orbit-tasks[parquet]).",
)  # fmt: skip
@click.option("--out", "out", required=True, help="The file to write (never left half-written).")
@click.option("--force", is_flag=True, help="Replace an existing --out file.")
@json_option
def archive_export(
    ns: str,
    kind: str,
    volumes: tuple[str, ...],
    settled_from: datetime | None,
    settled_until: datetime | None,
    fmt: str,
    out: str,
    force: bool,
    as_json: bool,
) -> None:
    """Write every root settled in [--settled-from, --settled-until) across the SUCCEEDED jobs
    of KIND, with its children, to --out; each file is verified while it is read."""
    window, namespace, mounted = _open(ns, kind, settled_from, settled_until, volumes)
    result = export_window(
        platform_engine(), namespace.id, namespace.name, kind, window, mounted,
        ExportFormat(fmt), Path(out), force=force,
    )  # fmt: skip
    data = result.to_dict()
    data["uncovered"] = _warn_uncovered(result.read)
    files = sum(r.files_decoded for r in result.read.reads)
    human = (
        f"exported {result.read.roots} roots of {len(result.read.reads)} jobs "
        f"({files} files verified and decoded) to {result.out} ({fmt}, {result.bytes} bytes)"
    )
    if as_json:
        click.echo(json.dumps(data, sort_keys=True))
    else:
        click.echo(human)


@click.command("roots")
@click.argument("ns")
@click.argument("kind")
@_window_options
@json_option
def archive_roots(
    ns: str,
    kind: str,
    volumes: tuple[str, ...],
    settled_from: datetime | None,
    settled_until: datetime | None,
    as_json: bool,
) -> None:
    """List the roots settled in [--settled-from, --settled-until) across the SUCCEEDED jobs
    of KIND: each one's id, settled time, job, file and position (files verified as read)."""
    window, namespace, mounted = _open(ns, kind, settled_from, settled_until, volumes)
    read, refs = list_roots(platform_engine(), namespace.id, namespace.name, kind, window, mounted)
    # All or nothing, in bounded memory: the listing is spooled to an unnamed temp file and
    # printed once every file of the window verified; a bad file prints only its error line.
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8") as sp:
        if as_json:
            sp.write('{"items":[')
            for i, ref in enumerate(refs):
                sp.write(("," if i else "") + json.dumps(ref, sort_keys=True))
            sp.write('],"next":null}\n')
        else:
            sp.write("  ".join(c.upper() for c in ROOT_COLUMNS) + "\n")
            for ref in refs:
                sp.write("  ".join(str(ref[c]) for c in ROOT_COLUMNS) + "\n")
        sp.seek(0)
        while chunk := sp.read(SPOOL_BYTES):
            click.echo(chunk, nl=False)
    _warn_uncovered(read)
