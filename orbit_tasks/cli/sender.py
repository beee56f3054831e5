"""``orbit sender ...``: the business database of the outbox sender and its operator commands."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import click

from orbit_tasks.cli.common import emit, emit_list, json_option
from orbit_tasks.cli.db import sender_db_group
from orbit_tasks.db.engine import DB_CLOCK
from orbit_tasks.db.registry import business_engine
from orbit_tasks.errors import IllegalState, InvalidInput, NotFound
from orbit_tasks.logs import log_action
from orbit_tasks.sender import policy
from orbit_tasks.sender import store as sender_store
from orbit_tasks.sender.names import resolve_namespace_id
from orbit_tasks.settings import get_settings

LIST_COLUMNS = [
    "namespace_id",
    "operation_id",
    "state",
    "last_code",
    "send_count",
    "wake_at",
    "task_id",
]

logger = logging.getLogger("orbit.cli.sender")


@click.group("sender")
def sender_group() -> None:
    """Outbox sender (business database)."""


sender_group.add_command(sender_db_group)  # orbit sender db upgrade|check|current (cli/db.py)


def _hex(value: str, what: str) -> str:
    if not policy.is_hex32(value):
        raise InvalidInput(f"{what} {value!r} must be 32 lowercase hexadecimal characters")
    return value


def _namespace(ref: str) -> str:
    """NS as a name or a 32-hex id (orbit_tasks/sender/names.py, docs/sender.md)."""
    return resolve_namespace_id(ref, get_settings())


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dt.datetime):
            out[key] = value.isoformat(timespec="microseconds") + "Z"
        elif isinstance(value, bytes | bytearray):
            out[key] = bytes(value).hex()
        else:
            out[key] = value
    return out


@sender_group.command("list")
@click.option(
    "--state",
    type=click.Choice(policy.STATES),
    default=None,
    help="Only rows in this state.",
)
@click.option("--namespace", "namespace", default=None, help="Only this namespace (name or id).")
@click.option(
    "--limit", type=click.IntRange(1, 10000), default=100, show_default=True, help="Max rows."
)
@click.option("--after", default=None, help="Cursor NS:OP from the previous page ('next').")
@json_option
def sender_list(
    state: str | None, namespace: str | None, limit: int, after: str | None, as_json: bool
) -> None:
    """List outbox rows in (namespace, operation) order, a page at a time.

    With --json: {"items": [...], "next": cursor-or-null}; pass "next" to --after for the next
    page."""
    cursor = None
    if after is not None:
        parts = after.split(":")
        if len(parts) != 2:
            raise InvalidInput(f"--after {after!r} must be NS:OP (two 32-hex ids)")
        cursor = (_hex(parts[0], "--after namespace"), _hex(parts[1], "--after operation"))
    ns = None if namespace is None else _namespace(namespace)
    with business_engine().connect() as conn:
        found = sender_store.list_rows(
            conn, state=state, namespace_id=ns, limit=limit + 1, after=cursor
        )
    page = [_plain(r) for r in found[:limit]]
    more = len(found) > limit
    next_cursor = f"{page[-1]['namespace_id']}:{page[-1]['operation_id']}" if more else None
    if as_json:
        emit_list(page, True, LIST_COLUMNS, next_cursor=next_cursor)
        return
    shown = [{k: ("-" if v is None else v) for k, v in r.items()} for r in page]
    emit_list(shown, False, LIST_COLUMNS, next_cursor=next_cursor)


def _load(conn: Any, ns: str, op: str) -> Any:
    row = sender_store.get_row(conn, ns, op)
    if row is None:
        raise NotFound(f"outbox row namespace {ns} operation {op} does not exist")
    return row


@sender_group.command("show")
@click.argument("ns", metavar="NS")
@click.argument("op", metavar="OP")
@json_option
def sender_show(ns: str, op: str, as_json: bool) -> None:
    """Show one outbox row (without the request body; see its size and digest).

    NS is a namespace name or 32-hex id; OP the 32-hex operation id."""
    op = _hex(op, "OP")
    ns = _namespace(ns)
    with business_engine().connect() as conn:
        row = _load(conn, ns, op)
        job = sender_store.get_job(conn, ns, op)
    data = _plain(dict(row._mapping))
    data["request_bytes"] = len(row.request_json.encode("utf-8"))
    data["digest_ok"] = policy.digest(row.request_json) == bytes(row.request_digest)
    del data["request_json"]
    data["source_ref"] = None if job is None else job.source_ref
    data["job_task_id"] = None if job is None else job.task_id
    if as_json:
        emit(data, True)
        return
    for key in sorted(data):
        click.echo(f"{key:18} {data[key] if data[key] is not None else '-'}")


@sender_group.command("requeue")
@click.argument("ns", metavar="NS")
@click.argument("op", metavar="OP")
@json_option
def sender_requeue(ns: str, op: str, as_json: bool) -> None:
    """Put a REVIEW row back to PENDING (same key and body). Refused past its deadline or at
    100 sends (exit 3). NS is a namespace name or 32-hex id; OP the 32-hex operation id."""
    op = _hex(op, "OP")
    ns = _namespace(ns)
    with business_engine().begin() as conn:
        row = _load(conn, ns, op)
        now = DB_CLOCK.now(conn)
        why = policy.requeue_refusal(now, row.state, row.send_count, row.send_deadline_at)
        if why:
            raise IllegalState(f"cannot requeue {ns}/{op}: {why}")
        if not sender_store.requeue(conn, row, now):
            raise IllegalState(f"cannot requeue {ns}/{op}: the row changed meanwhile; retry")
    log_action(
        logger,
        "sender.row.requeued",
        namespace_id=ns,
        operation_id=op,
        previous_code=row.last_code,
        send_count=row.send_count,
    )
    emit(
        {"namespace_id": ns, "operation_id": op, "state": "PENDING"},
        as_json,
        f"requeued {ns}/{op} (PENDING, same key and body)",
    )


def register(cli: click.Group) -> None:
    cli.add_command(sender_group)
