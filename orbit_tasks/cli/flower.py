"""``orbit flower``: Flower on the project's Celery app, with basic auth (SPEC §12 "Flower").

Runs Flower in this process (not ``celery flower``), so that the credentials from
``ORBIT_FLOWER_BASIC_AUTH`` never appear in a command line or a log line, and Flower's and
tornado's records go through the project's one log handler (text or json). ``FLOWER_*``
environment options are not read: the flags below are the whole interface.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
from typing import Any

import click

from orbit_tasks.cli.common import DurationParam, IntegerParam, check_listen, server_options
from orbit_tasks.flower_options import (
    PURGE_OFFLINE_WORKERS_SECONDS,
    TASKS_COLUMNS,
    require_auth,
    task_history_size,
)
from orbit_tasks.logs import configure_from_settings, log_action
from orbit_tasks.settings import get_settings
from orbit_tasks.units import format_duration

log = logging.getLogger("orbit.cli.flower")


def _exit_on_sigterm(*_: Any) -> None:
    sys.exit(0)


@click.command("flower")
@server_options(5555, aliases=("--address",))  # --address: Flower's own name, still accepted
@click.option(
    "--no-auth",
    is_flag=True,
    help="Run without ORBIT_FLOWER_BASIC_AUTH; only with a loopback --address (pages only: "
    "Flower's HTTP API stays closed without auth).",
)
@click.option(
    "--max-tasks",
    type=IntegerParam(1_000, 10_000_000),
    default=None,
    help="Tasks kept in memory (default: a day of sender and archive ticks plus 50,000 archive "
    "tasks, from ORBIT_SENDER_TICK_SECONDS and ORBIT_TICK_SECONDS; 140,000 with the defaults).",
)
@click.option(
    "--purge-offline-workers",
    type=DurationParam(60, 30 * 86_400),
    default=format_duration(PURGE_OFFLINE_WORKERS_SECONDS),
    show_default=True,
    help="How long after going offline a worker leaves the workers page (1m..30d, e.g. 1h).",
)
def flower(
    host: str, port: int, no_auth: bool, max_tasks: int | None, purge_offline_workers: int
) -> None:
    """Run Flower (workers, queues, tasks) on the project's Celery app until interrupted.

    Requires ORBIT_FLOWER_BASIC_AUTH=user:password[,user:password]. Flower's own /metrics and
    /healthcheck answer without auth: bind to loopback or put Flower behind a proxy."""
    settings = get_settings()
    address = host
    auth = require_auth(address, no_auth, len(settings.flower_basic_auth))
    history = max_tasks or task_history_size(settings.sender_tick_seconds, settings.tick_seconds)
    configure_from_settings("INFO")
    # Flower logs each request at INFO; keep refusals (4xx) and errors, not every page view.
    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    if not auth:
        # With no auth this variable would open Flower's API to every origin (CORS *).
        os.environ.pop("FLOWER_UNAUTHENTICATED_API", None)

    check_listen(address, port)  # a busy port: one line, exit 3 (docs/cli.md "Servers")
    # Imported here: Flower and Celery (~0.4 s) cost every other `orbit` command.
    from flower.app import Flower
    from flower.options import options
    from flower.urls import settings as flower_settings

    from orbit_tasks.celery_app import app as celery_app

    options.address = address
    options.port = port
    options.basic_auth = list(settings.flower_basic_auth) if auth else []
    options.max_tasks = history
    options.purge_offline_workers = purge_offline_workers
    options.tasks_columns = TASKS_COLUMNS
    options.enable_events = True
    flower_app = Flower(capp=celery_app, options=options, **dict(flower_settings, debug=False))
    atexit.register(flower_app.stop)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    bound = flower_app.start_http_server()
    log_action(
        log,
        "flower.started",
        address=address,
        port=bound,
        auth="basic" if auth else "none",
        users=len(settings.flower_basic_auth) if auth else 0,
        max_tasks=history,
        purge_offline_workers=purge_offline_workers,
    )
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        flower_app.start()


def register(cli: click.Group) -> None:
    cli.add_command(flower)
