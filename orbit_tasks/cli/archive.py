"""``orbit archive tick``: one archive tick now, the same code as beat's task (SPEC §7, §9);
``orbit archive pause|resume|controls|throttle|window``: the archive controls (issue 16,
docs/archive-controls.md). Every change is one transaction with its audit row."""

from __future__ import annotations

from typing import Any

import click
from sqlalchemy import Connection

from orbit_tasks.archive import controls as rules
from orbit_tasks.archive.controls import ControlKind, Scope
from orbit_tasks.archive.store import controls as control_store
from orbit_tasks.archive.tick import run_tick
from orbit_tasks.cli.common import (
    IntegerParam,
    LazyGroup,
    ReasonParam,
    emit,
    emit_list,
    iso_utc,
    json_option,
)
from orbit_tasks.db.engine import DB_CLOCK
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.errors import InvalidInput, NotFound
from orbit_tasks.ids import from_hex
from orbit_tasks.platform.history import history_kind
from orbit_tasks.platform.store import get_namespace, resolve_namespace, storage_exists
from orbit_tasks.settings import get_settings


@click.group(
    "archive",
    cls=LazyGroup,
    lazy={
        "restore": "orbit_tasks.cli.restore:archive_restore",
        "export": "orbit_tasks.cli.export:archive_export",
        "roots": "orbit_tasks.cli.export:archive_roots",
    },
)
def archive_group() -> None:
    """History archive."""


@archive_group.command("tick")
@json_option
def archive_tick(as_json: bool) -> None:
    """Run one tick: create jobs for due plans, then publish wake-ups (to CELERY_BROKER_URL)."""
    report = run_tick(platform_engine(), get_settings())
    data = report.to_dict()
    if as_json:
        emit(data, True)
        return
    lines = [
        f"storages {report.storages}, jobs created {len(report.jobs_created)}, "
        f"coalesced {len(report.coalesced)}, wake-ups published {report.wakeups_published}"
    ]
    lines += [f"created job {j} for {ns}/{k}" for ns, k, j in report.jobs_created]
    lines += [f"policy unconfirmed: {ns}/{k} (no job)" for ns, k in report.policy_unconfirmed]
    lines += [
        f"namespace not active: {ns}/{k} (run skipped)" for ns, k in report.namespace_inactive
    ]
    click.echo("\n".join(lines))


# --- controls (issue 16) ------------------------------------------------------------------------


def _scope(conn: Connection, storage: str | None, namespace: str | None, kind: str | None) -> Scope:
    """The scope named by the options, each checked against the database (unknown: exit 4)."""
    storage_id = ns_id = None
    if kind is not None and namespace is None:
        raise InvalidInput(f"--kind {kind!r} needs --namespace (a kind is one namespace's)")
    if storage is not None:
        storage_id = from_hex(storage, "storage id")
        if not storage_exists(conn, storage_id):
            raise NotFound(f"storage {storage} is not registered (see orbit storage list)")
    if namespace is not None:
        ns_id = resolve_namespace(conn, namespace).id
    if kind is not None:
        history_kind(kind)  # unknown: one line with the allowed kinds, exit 2
    return Scope(storage_id, ns_id, kind)


def _one_of(storage: str | None, namespace: str | None) -> None:
    if (storage is None) == (namespace is None):
        raise InvalidInput("give exactly one of --storage ID or --namespace NS")


def _describe(scope: Scope, names: dict[bytes, str] | None = None) -> str:
    if scope.is_everything:
        return "everything"
    parts = []
    if scope.storage_id is not None:
        parts.append(f"storage {scope.storage_id.hex()}")
    if scope.namespace_id is not None:
        name = (names or {}).get(scope.namespace_id, scope.namespace_id.hex())
        parts.append(f"namespace {name}")
    if scope.kind is not None:
        parts.append(f"kind {scope.kind}")
    return ", ".join(parts)


def _change(change: control_store.Change) -> bool:
    settings = get_settings()
    with platform_engine().begin() as conn:
        return control_store.change(conn, change, actor=settings.operator, clock=DB_CLOCK)


def _done(as_json: bool, action: str, scope: Scope, changed: bool, **extra: Any) -> None:
    data = {"action": action, "scope": scope.key, "changed": changed, **extra}
    what = _describe(scope)
    if not changed:
        human = f"{what}: nothing to {action} (no such control in force); nothing changed"
    else:
        human = f"{action}: {what}" + "".join(f"; {k} {v}" for k, v in extra.items() if v)
    emit(data, as_json, human)


def _scope_options(fn: Any) -> Any:
    fn = click.option("--kind", help="History kind (with --namespace).")(fn)
    fn = click.option("--namespace", "namespace", help="Namespace name or id.")(fn)
    return click.option("--storage", "storage", help="Registered storage id (32 hex).")(fn)


@archive_group.command("pause")
@_scope_options
@click.option(
    "--reason",
    type=ReasonParam(rules.MAX_REASON),
    required=True,
    help="Why (1..255 characters of printable text on one line; `orbit archive controls`).",
)
@json_option
def archive_pause(
    storage: str | None, namespace: str | None, kind: str | None, reason: str, as_json: bool
) -> None:
    """Pause archive jobs of a scope (none = everything): no new claims; running claims stop
    at their next batch boundary and wait PENDING."""
    rules.validate_reason(reason)
    with platform_engine().connect() as conn:
        scope = _scope(conn, storage, namespace, kind)
    changed = _change(control_store.Change(ControlKind.PAUSE, scope, reason=reason))
    _done(as_json, "pause", scope, changed, reason=reason)


@archive_group.command("resume")
@_scope_options
@json_option
def archive_resume(
    storage: str | None, namespace: str | None, kind: str | None, as_json: bool
) -> None:
    """Lift the pause of exactly this scope (work continues within one tick)."""
    with platform_engine().connect() as conn:
        scope = _scope(conn, storage, namespace, kind)
    changed = _change(control_store.Change(ControlKind.PAUSE, scope, clear=True))
    _done(as_json, "resume", scope, changed)


@archive_group.command("throttle")
@click.option("--storage", "storage", help="Registered storage id (32 hex).")
@click.option("--namespace", "namespace", help="Namespace name or id.")
@click.option(
    "--max-roots-per-second",
    "rate",
    type=IntegerParam(1, rules.MAX_ROOTS_PER_SECOND),
    help="Roots per second for the whole scope (1..10,000,000).",
)
@click.option("--clear", is_flag=True, help="Remove the throttle of this scope.")
@json_option
def archive_throttle(
    storage: str | None, namespace: str | None, rate: int | None, clear: bool, as_json: bool
) -> None:
    """Pace a scope: at most N roots per second across every worker and job in it."""
    _one_of(storage, namespace)
    if clear == (rate is not None):
        raise InvalidInput("give exactly one of --max-roots-per-second N or --clear")
    value = None if rate is None else rules.validate_rate(rate)
    with platform_engine().connect() as conn:
        scope = _scope(conn, storage, namespace, None)
    change = control_store.Change(
        ControlKind.THROTTLE, scope, clear=clear, max_roots_per_second=value
    )
    changed = _change(change)
    _done(
        as_json, "throttle clear" if clear else "throttle", scope, changed,
        max_roots_per_second=value,
    )  # fmt: skip


@archive_group.command("window")
@click.option("--storage", "storage", help="Registered storage id (32 hex).")
@click.option("--namespace", "namespace", help="Namespace name or id.")
@click.option("--clear", is_flag=True, help="Remove the run windows of this scope.")
@click.argument("windows", nargs=-1)
@json_option
def archive_window(
    storage: str | None,
    namespace: str | None,
    clear: bool,
    windows: tuple[str, ...],
    as_json: bool,
) -> None:
    """Claim only inside these daily UTC windows, e.g. 01:00-06:00 22:00-23:30 (may wrap
    midnight: 22:00-02:00); running claims stop at a batch boundary when a window closes."""
    _one_of(storage, namespace)
    if clear and windows:
        raise InvalidInput("give windows or --clear, not both")
    parsed = () if clear else rules.parse_windows(windows)
    with platform_engine().connect() as conn:
        scope = _scope(conn, storage, namespace, None)
    changed = _change(control_store.Change(ControlKind.WINDOW, scope, clear=clear, windows=parsed))
    _done(
        as_json, "window clear" if clear else "window", scope, changed,
        windows=rules.format_windows(parsed),
    )  # fmt: skip


@archive_group.command("controls")
@json_option
def archive_controls(as_json: bool) -> None:
    """What is in force: pauses, throttles and run windows, by whom, since when, why."""
    with platform_engine().connect() as conn:
        controls = control_store.list_controls(conn)
        names = {}
        for c in controls:
            if c.scope.namespace_id is not None and c.scope.namespace_id not in names:
                ns = get_namespace(conn, c.scope.namespace_id)
                names[c.scope.namespace_id] = ns.name if ns else c.scope.namespace_id.hex()
    items = [
        {
            "control": c.kind.value,
            "scope": c.scope.key,
            "storage_id": None if c.scope.storage_id is None else c.scope.storage_id.hex(),
            "namespace_id": None if c.scope.namespace_id is None else c.scope.namespace_id.hex(),
            "namespace": names.get(c.scope.namespace_id) if c.scope.namespace_id else None,
            "kind": c.scope.kind,
            "max_roots_per_second": c.max_roots_per_second,
            "windows": [str(w) for w in c.windows],
            "reason": c.reason,
            "actor": c.actor,
            "since": iso_utc(c.since),
        }
        for c in controls
    ]
    if as_json:
        emit_list(items, True, [])
        return
    rows = [
        {
            "control": i["control"],
            "scope": _describe(c.scope, names),
            "setting": (
                f"{i['max_roots_per_second']} roots/s"
                if i["max_roots_per_second"]
                else " ".join(i["windows"]) or "-"
            ),
            "by": i["actor"],
            "since": i["since"],
            "reason": i["reason"],
        }
        for i, c in zip(items, controls, strict=True)
    ]
    emit_list(rows, False, ["control", "scope", "setting", "by", "since", "reason"])


def register(cli: click.Group) -> None:
    cli.add_command(archive_group)
