"""``orbit api serve``: run the reference platform API (uvicorn, one process)."""

from __future__ import annotations

import logging

import click

from orbit_tasks.cli.common import WordChoice, check_listen, server_options
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.db.schema_check import require_schema
from orbit_tasks.logs import configure_from_settings

LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


@click.group("api")
def api_group() -> None:
    """Reference platform API (task submission with idempotency keys)."""


@api_group.command("serve")
@server_options(8080)
@click.option(
    "--log-level",
    type=WordChoice(LOG_LEVELS),
    default="info",
    show_default=True,
    help="Level of the server's and the API's log lines.",
)
def serve(host: str, port: int, log_level: str) -> None:
    """Serve the API against the platform database (ORBIT_DATABASE_URL) until interrupted.

    Access log lines carry method, path and status only; tokens, idempotency keys and request
    bodies are never logged."""
    check_listen(host, port)  # a busy port: one line, exit 3 (docs/cli.md "Servers")
    # Imported here: FastAPI and uvicorn (~0.45 s) cost every other `orbit` command.
    import uvicorn

    from orbit_tasks.api.app import create_app

    # uvicorn's loggers go through the one root handler (text or json, SPEC §12 "Logs");
    # ORBIT_LOG_LEVEL, when set, wins over --log-level.
    configure_from_settings(log_level.upper())
    # SPEC §12: refuse a missing or different schema; a database that is down at start is not
    # refused (the API answers 503 until it is back, see docs/schema.md)
    require_schema(platform_engine(), "platform", allow_unreachable=True)
    app = create_app(platform_engine())
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=logging.getLogger().level,
        log_config=None,
        server_header=False,
    )


def register(cli: click.Group) -> None:
    cli.add_command(api_group)
