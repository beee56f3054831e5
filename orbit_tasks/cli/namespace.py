"""``orbit namespace create|list|retire``: tenants of the platform."""

from __future__ import annotations

import click

from orbit_tasks.archive.jobs import TERMINAL_STATES, JobState
from orbit_tasks.cli.common import emit, emit_list, iso_utc, json_option
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.errors import IllegalState, InvalidInput
from orbit_tasks.platform import store
from orbit_tasks.platform.store import RetiredKind
from orbit_tasks.sender.policy import reason_refusal
from orbit_tasks.settings import get_settings

#: Jobs that hold their plan, storage and namespace: PENDING, RUNNING and FAILED (a FAILED job
#: waits for `job retry` or `job abandon`); SUCCEEDED and ABANDONED ones are done.
ACTIVE_JOB_STATES = tuple(s.value for s in JobState if s not in TERMINAL_STATES)
#: What `namespace list --all` and `storage list --all` add to each row.
RETIRED_COLUMNS = ["retired_at", "retired_by", "retired_reason"]


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
@click.option("--all", "show_all", is_flag=True, help="Also the retired ones (state RETIRED).")
@json_option
def namespace_list(show_all: bool, as_json: bool) -> None:
    """List namespaces (id, name, state, created_at); retired ones only with --all, which adds
    retired_at, retired_by and retired_reason."""
    with platform_engine().begin() as conn:
        retired = store.retirements_of(conn, RetiredKind.NAMESPACE) if show_all else {}
        rows = []
        for n in store.list_namespaces(conn, retired=show_all):
            row = {
                "id": n.id.hex(),
                "name": n.name,
                "state": "RETIRED" if n.id in retired else n.state,
                "created_at": iso_utc(n.created_at),
            }
            if show_all:
                row.update(retired_fields(retired.get(n.id)))
            rows.append(row)
    columns = ["id", "name", "state", "created_at"]
    emit_list(rows, as_json, columns + (RETIRED_COLUMNS if show_all else []))


def retired_fields(r: store.Retirement | None) -> dict[str, object]:
    """The columns of `list --all` (None for a live one)."""
    if r is None:
        return dict.fromkeys(RETIRED_COLUMNS)
    return {
        "retired_at": iso_utc(r.retired_at),
        "retired_by": r.retired_by,
        "retired_reason": r.reason,
    }


def checked_reason(reason: str) -> str:
    """``--reason`` of a retirement: the sender's rule (1..500 characters, one printable line)."""
    why = reason_refusal(reason)
    if why:
        raise InvalidInput(why)
    return reason


@namespace_group.command("retire")
@click.argument("ns")
@click.option("--reason", required=True, help="Why (1..500 characters, one line); recorded.")
@json_option
def namespace_retire(ns: str, reason: str, as_json: bool) -> None:
    """Retire namespace NS (name or id): it leaves `namespace list` (see --all) and the metrics,
    and gets no new plans, policies, queues, credentials or API tasks (its state becomes
    DISABLED); its archives stay readable (job verify|export|restore, archive restore).

    Refused (exit 3) while it has enabled plans or PENDING, RUNNING or FAILED jobs. Retiring a
    retired namespace changes nothing (exit 0). Audited (namespace.retire).
    """
    checked_reason(reason)
    actor = get_settings().operator
    with platform_engine().begin() as conn:
        target = store.resolve_namespace(conn, ns)
        now = db_now(conn)
        earlier = store.insert_retirement(
            conn, RetiredKind.NAMESPACE, target.id, reason=reason, actor=actor, at=now
        )
        if earlier is None:
            found = store.holds(conn, namespace_id=target.id, active_states=ACTIVE_JOB_STATES)
            if found:
                raise IllegalState(
                    f"namespace {target.name!r} cannot be retired: it holds {found.describe()}; "
                    "disable its plans (`orbit plan set NS KIND --disable`) and retry or abandon "
                    "its jobs (`orbit job abandon NS JOB`) first"
                )
            store.set_namespace_state(conn, target.id, "DISABLED")
            store.insert_audit(
                conn,
                target.id,
                actor=actor,
                action="namespace.retire",
                target_kind="namespace",
                target_id=target.id.hex(),
                detail={"name": target.name, "state": [target.state, "DISABLED"], "reason": reason},
                at=now,
            )
    done = earlier or store.Retirement(RetiredKind.NAMESPACE, target.id, reason, actor, now)
    data = {
        "id": target.id.hex(),
        "name": target.name,
        "retired": earlier is None,
        **retired_fields(done),
    }
    human = (
        f"retired namespace {target.name} ({target.id.hex()})"
        if earlier is None
        else f"namespace {target.name} was already retired at {iso_utc(earlier.retired_at)} by "
        f"{earlier.retired_by}; nothing changed"
    )
    emit(data, as_json, human)


def register(cli: click.Group) -> None:
    cli.add_command(namespace_group)
