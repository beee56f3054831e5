"""``orbit credential create|list|revoke``: API tokens for the platform API.

A token is printed once, at creation; the database keeps only its SHA-256. A credential acts in
one namespace and, with ``--queues``, only on those queues.
"""

from __future__ import annotations

import click

from orbit_tasks.cli.common import emit, emit_list, iso_utc, json_option
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.errors import InvalidInput, NotFound
from orbit_tasks.ids import from_hex
from orbit_tasks.platform import store
from orbit_tasks.settings import get_settings

MAX_LABEL = 128


@click.group("credential")
def credential_group() -> None:
    """API credentials (tokens stored as SHA-256)."""


def _queue_refs(given: tuple[str, ...]) -> list[str] | None:
    """Every ``--queues`` value (repeated, each comma-separated) in one list; None: none given
    (every queue). Before, a repeated ``--queues`` kept only the last one."""
    if not given:
        return None
    refs = []
    for raw in given:
        entries = [q.strip() for q in raw.split(",")]
        if any(not q for q in entries):
            raise InvalidInput(
                f"--queues {raw!r} has an empty entry (allowed: comma-separated queue names or "
                "ids; --queues may be repeated)"
            )
        refs += [q for q in entries if q not in refs]
    return refs


@credential_group.command("create")
@click.argument("ns")
@click.option(
    "--queues",
    multiple=True,
    help="Comma-separated queue names or ids the token may use (default: every queue); may be "
    "repeated, the lists add up.",
)
@click.option("--label", default="", help=f"Human label (0..{MAX_LABEL} characters).")
@json_option
def credential_create(ns: str, queues: tuple[str, ...], label: str, as_json: bool) -> None:
    """Create a token for NS; prints its id and the token (shown only this once)."""
    refs = _queue_refs(queues)
    if len(label) > MAX_LABEL:
        raise InvalidInput(f"--label is {len(label)} characters long (allowed 0..{MAX_LABEL})")
    with platform_engine().begin() as conn:
        namespace = store.resolve_namespace(conn, ns)
        cred_id, token = store.create_credential(conn, namespace.id, refs, label)
        queue_ids = (
            None
            if refs is None
            else sorted({store.resolve_queue(conn, namespace.id, q).id.hex() for q in refs})
        )
        store.insert_audit(
            conn,
            namespace.id,
            actor=get_settings().actor,
            action="credential.create",
            target_kind="credential",
            target_id=cred_id.hex(),
            detail={"queues": queue_ids, "label": label},
        )
    data = {
        "id": cred_id.hex(),
        "token": token,
        "namespace_id": namespace.id.hex(),
        "queues": queue_ids,
    }
    emit(
        data,
        as_json,
        f"id:    {cred_id.hex()}\ntoken: {token}\n(the token is shown only once; store it now)",
    )


@credential_group.command("list")
@click.argument("ns")
@json_option
def credential_list(ns: str, as_json: bool) -> None:
    """List the credentials of NS (ids, labels, queues, dates; never tokens)."""
    with platform_engine().begin() as conn:
        namespace = store.resolve_namespace(conn, ns)
        rows = store.list_credentials(conn, namespace.id)
    for r in rows:
        r["created_at"], r["revoked_at"] = iso_utc(r["created_at"]), iso_utc(r["revoked_at"])
    if not as_json:
        for r in rows:
            r["queues"] = "*" if r["queues"] is None else ",".join(r["queues"])
            r["revoked_at"] = r["revoked_at"] or "-"
    emit_list(rows, as_json, ["id", "label", "queues", "created_at", "revoked_at"])


@credential_group.command("revoke")
@click.argument("ns")
@click.argument("credential_id", metavar="ID", required=False)
@json_option
def credential_revoke(ns: str, credential_id: str | None, as_json: bool) -> None:
    """Revoke credential ID (hex) of NS (name or id, as `create` and `list` take it). Exit 4 if
    NS or the credential does not exist, is another namespace's, or is already revoked."""
    if credential_id is None:
        # the form before 0.4.0 (`revoke ID`): say what changed instead of "missing argument"
        raise InvalidInput(
            "credential revoke takes NS ID, the namespace (name or id) as create and list take "
            "it, then the credential id (orbit credential list NS shows it)"
        )
    cred_id = from_hex(credential_id, "credential id")
    with platform_engine().begin() as conn:
        namespace = store.resolve_namespace(conn, ns)
        if store.credential_namespace(conn, cred_id) != namespace.id:
            raise NotFound(f"credential {credential_id} does not exist in namespace {ns}")
        now = db_now(conn)
        store.revoke_credential(conn, cred_id, now)
        store.insert_audit(
            conn,
            namespace.id,
            actor=get_settings().actor,
            action="credential.revoke",
            target_kind="credential",
            target_id=cred_id.hex(),
            detail={},
        )
    emit(
        {"id": cred_id.hex(), "namespace_id": namespace.id.hex(), "revoked_at": iso_utc(now)},
        as_json,
        f"credential {cred_id.hex()} of {namespace.name} revoked",
    )


def register(cli: click.Group) -> None:
    cli.add_command(credential_group)
