"""``orbit worker archive|control|sender`` and ``orbit beat``: start Celery processes (SPEC §7).

Every worker gets an explicit queue list (``-Q``), fair scheduling and prefetch 1 (celeryconfig).
``worker archive`` also checks the archive's replica (``ORBIT_ARCHIVE_SOURCE_URL``: it answers
and its history tables are the platform database's), then reads and verifies each volume's
identity file (exit 2 when it is missing or unreadable, exit 3 when two paths hold the same
storage) and that its storage is registered in the platform database (exit 4), then passes the
mounted volumes to the worker processes in ``ORBIT_ARCHIVE_VOLUMES`` and replaces itself with
``celery worker`` (``os.execve``). A volume may be ``s3://BUCKET/PREFIX``: its location comes
from the registry and its identity object is read and verified the same way (issue 18);
folders and S3 storages mix.

Every process first checks the schema of the database its tasks use (SPEC §12, docs/schema.md)
and refuses to start, in one line naming the table and the command that fixes it, when a table is
missing or differs or the revision is not head.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from orbit_tasks.archive.engine.storage import volumes_env
from orbit_tasks.archive.s3_locations import S3Location
from orbit_tasks.cli.common import IntegerParam, WordChoice, emit
from orbit_tasks.cli.places import open_place
from orbit_tasks.db.registry import business_engine, platform_engine
from orbit_tasks.db.schema_check import Chain, require_schema
from orbit_tasks.errors import ConflictError, NotFound
from orbit_tasks.platform import store
from orbit_tasks.queues import CONTROL_QUEUE, SENDER_QUEUE, queue_name
from orbit_tasks.settings import LOG_LEVELS, get_settings
from orbit_tasks.start_checks import (
    CHECKED_ENV,
    SOURCE_CHECKED,
    beat_chains,
    checked_marker,
    require_source,
)

VOLUMES_ENV = "ORBIT_ARCHIVE_VOLUMES"


def _require_schemas(env: dict[str, str], *chains: Chain) -> None:
    """The start check: refuse a missing or different schema before any process starts; the
    process is told which chains were checked (it would check them again otherwise)."""
    for chain in chains:
        require_schema(platform_engine() if chain == "platform" else business_engine(), chain)
    env[CHECKED_ENV] = checked_marker(chains)


def _celery(*args: str) -> list[str]:
    # json logs: no banner on stdout (SPEC §12, one JSON object per line); celery_app logs it.
    quiet = ["-q"] if get_settings().log_format == "json" else []
    return [sys.executable, "-m", "celery", "-A", "orbit_tasks.celery_app", *quiet, *args]


def _worker_argv(
    queues: list[str],
    concurrency: int,
    name: str,
    pool: str,
    loglevel: str,
    extra: tuple[str, ...] = (),
) -> list[str]:
    return _celery(
        "worker",
        "-Q",
        ",".join(queues),
        "-c",
        str(concurrency),
        "-P",
        pool,
        "-O",
        "fair",
        "--prefetch-multiplier",
        "1",
        "-n",
        name,
        "-l",
        loglevel,
        "-E",
        *extra,
    )


def _exec(argv: list[str], env: dict[str, str], print_only: bool) -> None:
    if print_only:
        emit({"argv": argv, "env": {k: env[k] for k in (VOLUMES_ENV,) if k in env}}, True)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)


_common = [
    click.argument("celery_args", nargs=-1, type=click.UNPROCESSED),
    click.option("--concurrency", "-c", type=IntegerParam(1, 256), default=1, show_default=True),
    click.option("--name", "-n", default=None, help="Node name (default <kind>-<pid>@<host>)."),
    click.option(
        "--pool",
        type=WordChoice(["prefork", "solo", "threads"]),
        default="prefork",
        show_default=True,
        help="Celery pool (time limits are enforced by prefork only).",
    ),
    click.option(
        "--loglevel", "-l", type=WordChoice(LOG_LEVELS), default="INFO", show_default=True
    ),
    click.option(
        "--print-command", is_flag=True, help="Print the celery command as JSON; do not start it."
    ),
]


def common_options(fn: Any) -> Any:
    for opt in reversed(_common):
        fn = opt(fn)
    return fn


def _node(name: str | None, kind: str) -> str:
    return name or f"{kind}-{os.getpid()}@{socket.gethostname()}"


_EPILOG = "Arguments after -- are passed to celery worker (e.g. -- --without-mingle)."


@click.group("worker")
def worker_group() -> None:
    """Start Celery workers with explicit queue lists."""


@worker_group.command("archive", epilog=_EPILOG)
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    required=True,
    help="A mounted archive volume or s3://BUCKET/PREFIX (repeatable).",
)
@click.option("--no-control", is_flag=True, help=f"Do not consume {CONTROL_QUEUE}.")
@common_options
def worker_archive(
    volumes: tuple[str, ...],
    no_control: bool,
    concurrency: int,
    name: str | None,
    pool: str,
    loglevel: str,
    print_command: bool,
    celery_args: tuple[str, ...],
) -> None:
    """Consume the queues of the given volumes (and orbit.control unless --no-control)."""
    env = dict(os.environ)
    _require_schemas(env, "platform")
    require_source()  # the replica of ORBIT_ARCHIVE_SOURCE_URL answers and has the same tables
    env[CHECKED_ENV] += f",{SOURCE_CHECKED}"
    mounted: dict[str, Path | S3Location] = {}
    given: dict[str, str] = {}
    with platform_engine().connect() as conn:
        for path in volumes:
            opened = open_place(conn, path)  # InvalidInput (exit 2) when missing or unreadable
            hex_id = opened.identity.storage_id.hex()
            if hex_id in mounted:
                raise ConflictError(
                    f"--volume {path} holds storage {hex_id}, already given as {given[hex_id]}"
                )
            if not store.storage_exists(conn, opened.identity.storage_id):
                raise NotFound(
                    f"--volume {path}: storage {hex_id} is not registered in this platform "
                    "database (run 'orbit storage init PATH' to register it)"
                )
            mounted[hex_id], given[hex_id] = opened.place, opened.where
    queues = [queue_name(bytes.fromhex(h)) for h in mounted]
    if not no_control:
        queues.append(CONTROL_QUEUE)
    env[VOLUMES_ENV] = volumes_env(mounted)
    argv = _worker_argv(queues, concurrency, _node(name, "archive"), pool, loglevel, celery_args)
    _exec(argv, env, print_command)


def _single_queue_worker(
    queue: str,
    kind: str,
    chain: Chain,
    *,
    concurrency: int,
    name: str | None,
    pool: str,
    loglevel: str,
    print_command: bool,
    celery_args: tuple[str, ...],
    check: Callable[[], None] | None = None,
) -> None:
    """A worker that consumes exactly one queue, whose tasks use ``chain``'s database, and
    mounts no volume. ``check`` runs after the schema check, unless only printing."""
    env = dict(os.environ)
    _require_schemas(env, chain)
    if check is not None and not print_command:
        check()
    env.pop(VOLUMES_ENV, None)
    argv = _worker_argv([queue], concurrency, _node(name, kind), pool, loglevel, celery_args)
    _exec(argv, env, print_command)


@worker_group.command("control", epilog=_EPILOG)
@common_options
def worker_control(**opts: Any) -> None:
    """Consume orbit.control only (ticks)."""
    _single_queue_worker(CONTROL_QUEUE, "control", "platform", **opts)


@worker_group.command("sender", epilog=_EPILOG)
@common_options
def worker_sender(**opts: Any) -> None:
    """Consume orbit.sender only (outbox relay). Refused at start (exit 2) without a credential
    the platform API at ORBIT_API_URL accepts."""
    _single_queue_worker(SENDER_QUEUE, "sender", "business", check=_require_api, **opts)


def _require_api() -> None:
    """The sender's credential and API answer (after the schema check), or exit 2."""
    # Imported here: httpx (~60 ms), which only this command of the group needs.
    from orbit_tasks.sender.client import require_api

    s = get_settings()
    require_api(s.api_url, s.api_token, timeout_seconds=s.sender_http_timeout_seconds)


@click.command("beat")
@click.option("--loglevel", "-l", type=WordChoice(LOG_LEVELS), default="INFO", show_default=True)
@click.option("--print-command", is_flag=True, help="Print the celery command as JSON only.")
def beat(loglevel: str, print_command: bool) -> None:
    """Run Celery beat. Several may run (one per node): the one holding the database lease
    publishes the ticks, the others stand by and log it (docs/operations.md "Several beats").
    Its schedule file lives under var/ (one per process)."""
    env = dict(os.environ)
    _require_schemas(env, *beat_chains())
    var_dir = get_settings().var_dir
    if not print_command:
        var_dir.mkdir(parents=True, exist_ok=True)
    argv = _celery("beat", "-s", str(var_dir / "celerybeat-schedule"), "-l", loglevel)
    _exec(argv, env, print_command)


def register(cli: click.Group) -> None:
    cli.add_command(worker_group)
    cli.add_command(beat)
