"""``orbit namespace create|list``: tenants of the platform."""

from __future__ import annotations

import click

from orbit_tasks.cli.common import emit, emit_list, iso_utc, json_option
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.platform import store
from orbit_tasks.settings import get_settings


@click.group("namespace")
def namespace_group() -> None:
    """Namespaces (tenants)."""


@namespace_group.command("create")
@click.argument("name")
@json_option
def namespace_create(name: str, as_json: bool) -> None:
    """Create namespace NAME (1-64 of a-z 0-9 _ . -, not 32 hex) and print its id.

    Exit 3 if the name is taken; exit 2 for a name of 32 hex characters (it would read as an id).
    """
    store.validate_name(name, "namespace")
    with platform_engine().begin() as conn:
        ns_id = store.create_namespace(conn, name)
        store.insert_audit(
            conn,
            ns_id,
            actor=get_settings().actor,
            action="namespace.create",
            target_kind="namespace",
            target_id=ns_id.hex(),
            detail={"name": name},
        )
    emit({"id": ns_id.hex(), "name": name}, as_json, ns_id.hex())


@namespace_group.command("list")
@json_option
def namespace_list(as_json: bool) -> None:
    """List namespaces (id, name, state, created_at)."""
    with platform_engine().begin() as conn:
        rows = [
            {
                "id": n.id.hex(),
                "name": n.name,
                "state": n.state,
                "created_at": iso_utc(n.created_at),
            }
            for n in store.list_namespaces(conn)
        ]
    emit_list(rows, as_json, ["id", "name", "state", "created_at"])


def register(cli: click.Group) -> None:
    cli.add_command(namespace_group)
