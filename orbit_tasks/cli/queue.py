"""``orbit queue create|list``: task queues of a namespace (for the platform API)."""

from __future__ import annotations

import click

from orbit_tasks.cli.common import emit, emit_list, json_option
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.platform import store
from orbit_tasks.settings import get_settings


@click.group("queue")
def queue_group() -> None:
    """Task queues of a namespace."""


@queue_group.command("create")
@click.argument("ns")
@click.argument("name")
@json_option
def queue_create(ns: str, name: str, as_json: bool) -> None:
    """Create queue NAME in NS (name or hex id) and print its id. Exit 3 if it exists.

    NAME: 1-64 of a-z 0-9 _ . -, not 32 hex characters (queue arguments read those as an id).
    """
    store.validate_name(name, "queue")
    with platform_engine().begin() as conn:
        namespace = store.resolve_namespace(conn, ns)
        queue_id = store.create_queue(conn, namespace.id, name)
        store.insert_audit(
            conn,
            namespace.id,
            actor=get_settings().actor,
            action="queue.create",
            target_kind="queue",
            target_id=queue_id.hex(),
            detail={"name": name},
        )
    emit(
        {"id": queue_id.hex(), "namespace_id": namespace.id.hex(), "name": name},
        as_json,
        queue_id.hex(),
    )


@queue_group.command("list")
@click.argument("ns")
@json_option
def queue_list(ns: str, as_json: bool) -> None:
    """List the queues of NS."""
    with platform_engine().begin() as conn:
        namespace = store.resolve_namespace(conn, ns)
        rows = [
            {"id": q.id.hex(), "name": q.name, "namespace_id": q.namespace_id.hex()}
            for q in store.list_queues(conn, namespace.id)
        ]
    emit_list(rows, as_json, ["id", "name"])


def register(cli: click.Group) -> None:
    cli.add_command(queue_group)
