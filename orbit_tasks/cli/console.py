"""``orbit console serve|user add|user list|user remove``: the operator console on the web
(issue 29, docs/console.md) and its people.

A person's password is read from standard input (one line; a terminal prompts twice, hidden)
and stored as scrypt, never itself. Adding and removing a person is one transaction with its
audit row (``console.user.add``, ``console.user.remove``; who: ORBIT_OPERATOR, else ORBIT_ACTOR,
else the OS user); removing one signs every session of theirs out."""

from __future__ import annotations

import logging
import sys

import click

from orbit_tasks.archive.store.controls import PLATFORM_NAMESPACE
from orbit_tasks.cli.common import (
    WordChoice,
    check_listen,
    emit,
    emit_list,
    iso_utc,
    json_option,
    server_options,
)
from orbit_tasks.console import access
from orbit_tasks.console import store as console_store
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.errors import InvalidInput
from orbit_tasks.platform.store import insert_audit
from orbit_tasks.settings import get_settings

LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


@click.group("console")
def console_group() -> None:
    """The operator console on the web: the fleet, jobs, dead letters and the audit log."""


@console_group.group("user")
def user_group() -> None:
    """People who may sign in to the console (viewer or operator)."""


def _read_secret() -> str:
    if sys.stdin.isatty():
        secret = click.prompt("password", hide_input=True, confirmation_prompt=True, err=True)
    else:
        secret = sys.stdin.readline().rstrip("\r\n")
    return access.validate_secret(str(secret))


@user_group.command("add")
@click.argument("name")
@click.option(
    "--role",
    type=WordChoice([r.value for r in access.Role]),
    required=True,
    help="viewer: reads every page; operator: also acts (pause, retry, requeue ...).",
)
@json_option
def user_add(name: str, role: str, as_json: bool) -> None:
    """Add NAME with a password read from stdin (a terminal prompts for it, twice)."""
    access.validate_user_name(name)
    secret = _read_secret()
    stored = access.hash_secret(secret)
    actor = get_settings().operator
    with platform_engine().begin() as conn:
        console_store.add_user(conn, name, access.Role(role), stored, actor)
        insert_audit(
            conn, PLATFORM_NAMESPACE, actor=actor, action="console.user.add",
            target_kind="console_user", target_id=name, detail={"role": role},
        )  # fmt: skip
    emit({"name": name, "role": role}, as_json, f"console user {name} added ({role})")


@user_group.command("list")
@json_option
def user_list(as_json: bool) -> None:
    """Every person of the console with their role (never a secret)."""
    with platform_engine().connect() as conn:
        users = console_store.list_users(conn)
    items = [
        {
            "name": u.name,
            "role": u.role.value,
            "created_by": u.created_by,
            "created_at": iso_utc(u.created_at),
        }
        for u in users
    ]
    emit_list(items, as_json, ["name", "role", "created_by", "created_at"])


@user_group.command("remove")
@click.argument("name")
@json_option
def user_remove(name: str, as_json: bool) -> None:
    """Remove NAME and sign every session of theirs out."""
    access.validate_user_name(name)
    actor = get_settings().operator
    with platform_engine().begin() as conn:
        console_store.remove_user(conn, name)
        insert_audit(
            conn, PLATFORM_NAMESPACE, actor=actor, action="console.user.remove",
            target_kind="console_user", target_id=name, detail={},
        )  # fmt: skip
    emit({"name": name, "removed": True}, as_json, f"console user {name} removed")


@console_group.command("serve")
@server_options(8090)
@click.option(
    "--log-level",
    type=WordChoice(LOG_LEVELS),
    default="info",
    show_default=True,
    help="Level of the server's and the console's log lines.",
)
def serve(host: str, port: int, log_level: str) -> None:
    """Serve the console against the platform database (ORBIT_DATABASE_URL) and the business
    database (ORBIT_SENDER_DATABASE_URL) until interrupted. Bound to 127.0.0.1 unless --host."""
    # Imported here: FastAPI and uvicorn (~0.45 s) cost every other `orbit` command.
    import uvicorn

    from orbit_tasks.console.app import create_app
    from orbit_tasks.db.registry import business_engine
    from orbit_tasks.db.schema_check import require_schema
    from orbit_tasks.logs import configure_from_settings

    if not host.strip():
        raise InvalidInput("--host '' is empty (give an address, e.g. 127.0.0.1)")
    check_listen(host, port)  # a busy port: one line, exit 3 (docs/cli.md "Servers")
    configure_from_settings(log_level.upper())
    require_schema(platform_engine(), "platform")
    app = create_app(platform_engine(), business_engine(), get_settings())
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=logging.getLogger().level,
        log_config=None,
        server_header=False,
    )


def register(cli: click.Group) -> None:
    cli.add_command(console_group)
