"""``orbit sender ...``: the business database of the outbox sender and its operator commands."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

import click

from orbit_tasks import sender_limits
from orbit_tasks.cli.common import (
    DurationParam,
    IntegerParam,
    LazyGroup,
    ReasonParam,
    WordChoice,
    emit,
    emit_list,
    json_option,
)
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.registry import business_engine
from orbit_tasks.errors import InvalidInput
from orbit_tasks.sender import holds as sender_holds
from orbit_tasks.sender import policy
from orbit_tasks.sender import retention as sender_retention
from orbit_tasks.sender import review as sender_review
from orbit_tasks.sender.names import resolve_namespace_id
from orbit_tasks.sender.store import dead_letters, entries, listing, pruning
from orbit_tasks.settings import get_settings
from orbit_tasks.timestamps import format_ts

LIST_COLUMNS = [
    "namespace_id",
    "operation_id",
    "state",
    "last_code",
    "send_count",
    "wake_at",
    "task_id",
    "queue_held_until",
]

logger = logging.getLogger("orbit.cli.sender")


# `orbit sender db upgrade|check|current` (cli/db.py) is loaded on first use: it imports alembic
# and the migration chain, 0.33 s of the 1.4 s every other `orbit sender` command took (measured
# with -X importtime).
@click.group("sender", cls=LazyGroup, lazy={"db": "orbit_tasks.cli.db:sender_db_group"})
def sender_group() -> None:
    """Outbox sender (business database)."""


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
            out[key] = format_ts(value)
        elif isinstance(value, bytes | bytearray):
            out[key] = bytes(value).hex()
        else:
            out[key] = value
    return out


@sender_group.command("list")
@click.option(
    "--state",
    type=WordChoice(policy.STATES),
    default=None,
    help="Only rows in this state.",
)
@click.option("--namespace", "namespace", default=None, help="Only this namespace (name or id).")
@click.option(
    "--limit", type=IntegerParam(1, 1000), default=50, show_default=True, help="Max rows."
)
@click.option("--after", default=None, help="Cursor NS:OP from the previous page ('next').")
@click.option(
    "--unresolved", is_flag=True, help="Only REVIEW rows nobody has resolved (the dead letters)."
)
@json_option
def sender_list(
    state: str | None,
    namespace: str | None,
    limit: int,
    after: str | None,
    unresolved: bool,
    as_json: bool,
) -> None:
    """List outbox rows in (namespace, operation) order, a page at a time.

    With --json: {"items": [...], "next": cursor-or-null}; pass "next" to --after for the next
    page."""
    if unresolved and state not in (None, policy.OutboxState.REVIEW):
        raise click.UsageError(
            f"--unresolved lists REVIEW rows; it does not go with --state {state}"
        )
    cursor = None
    if after is not None:
        parts = after.split(":")
        if len(parts) != 2:
            raise InvalidInput(f"--after {after!r} must be NS:OP (two 32-hex ids)")
        cursor = (_hex(parts[0], "--after namespace"), _hex(parts[1], "--after operation"))
    ns = None if namespace is None else _namespace(namespace)
    with business_engine().connect() as conn:
        found = [
            dataclasses.asdict(listed)
            for listed in listing.list_rows(
                conn,
                state=state,
                namespace_id=ns,
                limit=limit + 1,
                after=cursor,
                unresolved=unresolved,
            )
        ]
        now = db_now(conn)
        # A Retry-After hold still running on a row's queue (as `sender show` says): the row is
        # not claimed before it, by any sender process. Holds are one row per queue, few.
        held = {
            (h.namespace_id, h.queue_id): h.held_until
            for h in sender_holds.running_holds(conn, now)
        }
    for r in found:
        unsent = r["state"] in (policy.OutboxState.PENDING, policy.OutboxState.SENDING)
        r["queue_held_until"] = held.get((r["namespace_id"], r["queue_id"])) if unsent else None
    page = [_plain(r) for r in found[:limit]]
    more = len(found) > limit
    next_cursor = f"{page[-1]['namespace_id']}:{page[-1]['operation_id']}" if more else None
    if as_json:
        emit_list(page, True, LIST_COLUMNS, next_cursor=next_cursor)
        return
    shown = [{k: ("-" if v is None else v) for k, v in r.items()} for r in page]
    emit_list(shown, False, LIST_COLUMNS, next_cursor=next_cursor)


@sender_group.command("show")
@click.argument("ns", metavar="NS")
@click.argument("op", metavar="OP")
@json_option
def sender_show(ns: str, op: str, as_json: bool) -> None:
    """Show one outbox row (without the request body; see its size and digest), with its
    resolution if it is a resolved REVIEW row; of a pruned operation its compact record.

    NS is a namespace name or 32-hex id; OP the 32-hex operation id."""
    op = _hex(op, "OP")
    ns = _namespace(ns)
    with business_engine().connect() as conn:
        row = entries.get_row(conn, ns, op)
        pruned = pruning.get_pruned(conn, ns, op) if row is None else None
        if row is None and pruned is None:
            sender_review.load(conn, ns, op)  # NotFound, exit 4
        job = entries.get_job(conn, ns, op)
        resolution = dead_letters.get_resolution(conn, ns, op)
        hold = None if row is None else sender_holds.get_hold(conn, ns, row.queue_id)
        now = db_now(conn)
    if row is None:
        assert pruned is not None
        data = _plain(dataclasses.asdict(pruned))
        data["pruned"] = True
        data["idempotency_key"] = policy.idempotency_key(op)
        data["source_ref"] = None if job is None else job.source_ref
        _show(data, as_json)
        return
    data = _plain(dataclasses.asdict(row))
    current = resolution is not None and policy.resolution_current(
        row.state, row.updated_at, resolution.review_since
    )
    resolved = _plain(dataclasses.asdict(resolution)) if current and resolution else {}
    for key in ("resolved_by", "resolved_at", "reason"):
        data[key] = resolved.get(key)
    data["request_bytes"] = len(row.request_json.encode("utf-8"))
    data["digest_ok"] = policy.digest(row.request_json) == bytes(row.request_digest)
    del data["request_json"]
    data["source_ref"] = None if job is None else job.source_ref
    data["job_task_id"] = None if job is None else job.task_id
    data["pruned"] = False
    # A Retry-After hold of the row's queue still running (docs/sender.md): nothing of the queue
    # is claimed before it, by any sender process.
    running = None if hold is None or hold.held_until <= now else hold.held_until
    data["queue_held_until"] = _plain({"t": running})["t"]
    _show(data, as_json)


def _show(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(data, True)
        return
    for key in sorted(data):
        click.echo(f"{key:18} {data[key] if data[key] is not None else '-'}")


REVIEW_COLUMNS = [
    "namespace_id",
    "operation_id",
    "last_code",
    "send_count",
    "send_deadline_at",
    "action",
    "why",
]
REVIEW_CODES = sorted(policy.REVIEW_CODES)


def _one_or_code(ns: str | None, op: str | None, code: str | None, namespace: str | None) -> None:
    """Either NS OP or --code CODE [--namespace NS] (usage error, exit 2, otherwise)."""
    if code is None and (ns is None or op is None):
        raise click.UsageError("give NS OP, or --code CODE [--namespace NS]")
    if code is not None and (ns is not None or op is not None):
        raise click.UsageError("give NS OP or --code CODE, not both")
    if code is None and namespace is not None:
        raise click.UsageError("--namespace goes with --code (NS OP names one row)")


def _emit_bulk(items: list[dict[str, Any]], as_json: bool, summary: str) -> None:
    if as_json:
        emit_list(items, True, REVIEW_COLUMNS)
        return
    emit_list(
        [{k: ("-" if v is None else v) for k, v in i.items()} for i in items], False, REVIEW_COLUMNS
    )
    counts: dict[str, int] = {}
    for item in items:
        counts[item["action"]] = counts.get(item["action"], 0) + 1
    done = ", ".join(f"{n} {action}" for action, n in sorted(counts.items())) or "no rows"
    click.echo(f"{summary}: {done}")


@sender_group.command("requeue")
@click.argument("ns", metavar="NS", required=False)
@click.argument("op", metavar="OP", required=False)
@click.option(
    "--code",
    type=WordChoice(REVIEW_CODES),
    default=None,
    help="Every REVIEW row with this last_code (instead of NS OP).",
)
@click.option("--namespace", "namespace", default=None, help="With --code: only this namespace.")
@click.option("--dry-run", is_flag=True, help="Say what would happen, change nothing.")
@json_option
def sender_requeue(
    ns: str | None,
    op: str | None,
    code: str | None,
    namespace: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Put REVIEW rows back to PENDING (same key and body): one row (NS OP), or every REVIEW
    row with --code CODE [--namespace NS]. A row past its deadline or at 100 sends is refused
    (one row: exit 3; --code: listed as refused). NS is a namespace name or 32-hex id; OP the
    32-hex operation id."""
    _one_or_code(ns, op, code, namespace)
    if code is not None:
        scope = None if namespace is None else _namespace(namespace)
        items = sender_review.requeue_code(business_engine(), code, scope, dry_run=dry_run)
        _emit_bulk(items, as_json, "dry run" if dry_run else f"requeue --code {code}")
        return
    assert ns is not None and op is not None
    op = _hex(op, "OP")
    ns = _namespace(ns)
    sender_review.requeue_one(business_engine(), ns, op, dry_run=dry_run)
    if dry_run:
        emit(
            {
                "namespace_id": ns,
                "operation_id": op,
                "state": policy.OutboxState.REVIEW,
                "dry_run": True,
            },
            as_json,
            f"dry run: would requeue {ns}/{op} (PENDING, same key and body); nothing changed",
        )
        return
    emit(
        {"namespace_id": ns, "operation_id": op, "state": policy.OutboxState.PENDING},
        as_json,
        f"requeued {ns}/{op} (PENDING, same key and body)",
    )


@sender_group.command("resolve")
@click.argument("ns", metavar="NS", required=False)
@click.argument("op", metavar="OP", required=False)
@click.option(
    "--reason",
    type=ReasonParam(policy.MAX_REASON_CHARS),
    required=True,
    help="Why the row is handled (1..500 characters of printable text on one line).",
)
@click.option(
    "--code",
    type=WordChoice(REVIEW_CODES),
    default=None,
    help="Every unresolved REVIEW row with this last_code (instead of NS OP).",
)
@click.option("--namespace", "namespace", default=None, help="With --code: only this namespace.")
@click.option("--dry-run", is_flag=True, help="Say what would happen, change nothing.")
@json_option
def sender_resolve(
    ns: str | None,
    op: str | None,
    reason: str,
    code: str | None,
    namespace: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Mark REVIEW rows as handled, recorded with who (ORBIT_OPERATOR, else ORBIT_ACTOR, else the
    OS user) and why: one row
    (NS OP) or every unresolved REVIEW row with --code CODE [--namespace NS]. Resolved rows leave
    orbit_outbox_review_rows and `sender list --unresolved`, and may be pruned after the
    retention; the row itself is unchanged (a requeue ends the resolution)."""
    _one_or_code(ns, op, code, namespace)
    actor = get_settings().operator
    if code is not None:
        scope = None if namespace is None else _namespace(namespace)
        items = sender_review.resolve_code(
            business_engine(), code, scope, reason=reason, actor=actor, dry_run=dry_run
        )
        _emit_bulk(items, as_json, "dry run" if dry_run else f"resolve --code {code}")
        return
    assert ns is not None and op is not None
    op = _hex(op, "OP")
    ns = _namespace(ns)
    done = sender_review.resolve_one(
        business_engine(), ns, op, reason=reason, actor=actor, dry_run=dry_run
    )
    if dry_run:
        emit(
            {**done, "resolved_at": None, "dry_run": True},
            as_json,
            f"dry run: would resolve {ns}/{op} ({done['last_code']}) by {actor}; nothing changed",
        )
        return
    emit(done, as_json, f"resolved {ns}/{op} ({done['last_code']}) by {actor}")


@sender_group.command("prune")
@click.option(
    "--older-than",
    "older_than",
    type=DurationParam(sender_limits.MIN_RETENTION_SECONDS, sender_limits.MAX_RETENTION_SECONDS),
    required=True,
    help="Prune ACCEPTED rows (and resolved REVIEW rows) last changed before this "
    "long ago, e.g. 7d (s, m, h, d; 1s..3650d).",
)
@click.option("--namespace", "namespace", default=None, help="Only this namespace (name or id).")
@click.option("--dry-run", is_flag=True, help="Count what would be pruned, change nothing.")
@json_option
def sender_prune(older_than: int, namespace: str | None, dry_run: bool, as_json: bool) -> None:
    """Remove old ACCEPTED outbox rows (and resolved REVIEW rows) in short keyset-page
    transactions, keeping a compact record of each (sender_pruned), so that enqueue() of a
    pruned operation answers as before. PENDING and SENDING rows, and sender_jobs, stay."""
    seconds = older_than  # the one duration parser (cli/common.DurationParam), 1s..3650d
    scope = None if namespace is None else _namespace(namespace)
    report = sender_retention.prune(
        business_engine(), older_than_seconds=seconds, namespace_id=scope, dry_run=dry_run
    )
    data = report.as_fields()
    verb = "would prune" if dry_run else "pruned"
    skipped = data["skipped_in_both"]
    emit(
        data,
        as_json,
        f"{verb} {data['pruned']} rows ({data['accepted']} ACCEPTED, {data['review']} "
        f"resolved REVIEW) last changed before {data['cutoff']}; scanned {data['scanned']} "
        f"rows in {data['pages']} pages"
        + (f"; {skipped} skipped: already pruned (docs/operations.md)" if skipped else ""),
    )


def register(cli: click.Group) -> None:
    cli.add_command(sender_group)
