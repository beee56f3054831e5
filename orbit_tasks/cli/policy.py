"""``orbit policy set|list``: append-only retention policy revisions per (namespace, kind)."""

from __future__ import annotations

import click

from orbit_tasks.cli.common import DURATION, emit, emit_list, iso_utc, json_option
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.errors import InvalidInput
from orbit_tasks.platform import store
from orbit_tasks.platform.history import history_kind
from orbit_tasks.settings import get_settings
from orbit_tasks.units import format_duration


@click.group("policy")
def policy_group() -> None:
    """Retention policies: how long settled history stays before it may be archived."""


def _check_archive_after(seconds: int) -> None:
    if not store.MIN_ARCHIVE_AFTER <= seconds <= store.MAX_ARCHIVE_AFTER:
        raise InvalidInput(
            f"--archive-after {format_duration(seconds)} ({seconds}s) is out of range "
            f"(allowed {format_duration(store.MIN_ARCHIVE_AFTER)}.."
            f"{format_duration(store.MAX_ARCHIVE_AFTER)})"
        )


@policy_group.command("set")
@click.argument("ns")
@click.argument("kind")
@click.option(
    "--archive-after",
    type=DURATION,
    required=True,
    help="Settled records older than this may be archived (s/m/h/d, at least 1h).",
)
@json_option
def policy_set(ns: str, kind: str, archive_after: int, as_json: bool) -> None:
    """Append a new policy revision for NS (name or hex id) and KIND; prints the revision.

    Plans keep archiving under the revision they confirmed until an operator confirms the new
    one (``orbit plan set --policy-revision N``).
    """
    history_kind(kind)
    _check_archive_after(archive_after)
    actor = get_settings().actor
    with platform_engine().begin() as conn:
        namespace = store.resolve_namespace(conn, ns)
        revision = store.add_policy_revision(conn, namespace.id, kind, archive_after, actor)
        store.insert_audit(
            conn,
            namespace.id,
            actor=actor,
            action="archive.policy.set",
            target_kind="policy",
            target_id=kind,
            detail={"kind": kind, "revision": revision, "archive_after_seconds": archive_after},
        )
    data = {
        "namespace_id": namespace.id.hex(),
        "kind": kind,
        "revision": revision,
        "archive_after_seconds": archive_after,
    }
    emit(data, as_json, str(revision))


@policy_group.command("list")
@click.argument("ns")
@click.option("--kind", default=None, help="Only this history kind.")
@json_option
def policy_list(ns: str, kind: str | None, as_json: bool) -> None:
    """List every policy revision of NS (oldest first per kind)."""
    if kind is not None:
        history_kind(kind)
    with platform_engine().begin() as conn:
        namespace = store.resolve_namespace(conn, ns)
        rows = [
            {
                "namespace_id": p.namespace_id.hex(),
                "kind": p.kind,
                "revision": p.revision,
                "archive_after_seconds": p.archive_after_seconds,
                "archive_after": format_duration(p.archive_after_seconds),
                "created_at": iso_utc(p.created_at),
                "created_by": p.created_by,
            }
            for p in store.list_policies(conn, namespace.id, kind)
        ]
    emit_list(rows, as_json, ["kind", "revision", "archive_after", "created_at", "created_by"])


def register(cli: click.Group) -> None:
    cli.add_command(policy_group)
