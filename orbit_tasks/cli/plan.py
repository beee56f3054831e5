"""``orbit plan set|list|show|preview|run``: periodic archive plans per (namespace, kind) (SPEC §4,
§9); ``preview`` shows what a job created now would archive, and writes nothing; ``run`` makes
a plan due now and wakes the tick."""

from __future__ import annotations

import logging
from typing import Any

import click

from orbit_tasks.archive import plans as schedule
from orbit_tasks.archive.controls import ControlKind
from orbit_tasks.archive.engine import preview as plan_preview
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.wakeups import publish_tick
from orbit_tasks.cli.common import (
    DURATION,
    SIZE,
    IntegerParam,
    emit,
    emit_list,
    iso_utc,
    json_option,
)
from orbit_tasks.db.engine import DB_CLOCK, db_now
from orbit_tasks.db.faults import is_transient_db
from orbit_tasks.db.registry import platform_engine, source_engine
from orbit_tasks.errors import NotFound
from orbit_tasks.ids import from_hex
from orbit_tasks.logs import log_action
from orbit_tasks.platform.store import list_namespaces, resolve_namespace
from orbit_tasks.settings import get_settings
from orbit_tasks.units import format_duration, format_size

log = logging.getLogger("orbit.cli.plan")


@click.group("plan")
def plan_group() -> None:
    """Periodic archive plans (one per namespace and history kind)."""


def _view(plan: plan_store.Plan, ns_name: str, latest: int | None, now: Any) -> dict[str, Any]:
    data = plan.to_dict()
    data["namespace"] = ns_name
    data["latest_policy_revision"] = latest
    data["policy_confirmed"] = latest is not None and plan.policy_revision == latest
    data["due"] = schedule.is_due(plan.enabled, plan.next_run_at, now)
    return data


@plan_group.command("set")
@click.argument("ns")
@click.argument("kind")
@click.option("--storage", "storage", help="Registered storage id (32 hex). Required on create.")
@click.option("--interval", type=DURATION, help="Period, 1h..30d (e.g. 1d). Required on create.")
@click.option(
    "--batch-size", type=IntegerParam(), help="Roots per batch file, 1..100. Required on create."
)
@click.option("--max-bytes", type=SIZE, help="Byte budget of new jobs, 1MiB..1GiB.")
@click.option(
    "--policy-revision",
    type=IntegerParam(),
    help="Retention policy revision you confirm (must name it explicitly on create).",
)
@click.option(
    "--enable/--disable",
    "enabled",
    default=None,
    help="Trigger new jobs or not (a new plan is disabled unless --enable).",
)
@click.option(
    "--expect-revision",
    type=IntegerParam(),
    help="Compare-and-set: refuse unless the plan is at N (0 = new).",
)
@json_option
def plan_set(
    ns: str,
    kind: str,
    storage: str | None,
    interval: int | None,
    batch_size: int | None,
    max_bytes: int | None,
    policy_revision: int | None,
    enabled: bool | None,
    expect_revision: int | None,
    as_json: bool,
) -> None:
    """Create or change the plan of NS and KIND; prints the plan's revision.

    Options left out keep their current value on an existing plan. Enabling a plan (first time or
    after --disable) makes it due immediately. Setting identical values changes nothing.
    """
    schedule.validate_kind(kind)
    storage_id = None if storage is None else from_hex(storage, "--storage")
    settings = get_settings()
    with platform_engine().begin() as conn:
        namespace = resolve_namespace(conn, ns)
        now = db_now(conn)
        result = plan_store.set_plan(
            conn,
            namespace.id,
            kind,
            storage_id=storage_id,
            interval=interval,
            batch_size=batch_size,
            max_bytes=max_bytes,
            policy_revision=policy_revision,
            enabled=enabled,
            expect_revision=expect_revision,
            now=now,
            actor=settings.actor,
        )
        latest = plan_store.latest_policy_revision(conn, namespace.id, kind)
    data = _view(result.plan, namespace.name, latest, now)
    data["created"] = result.created
    data["changed"] = result.changed
    if as_json:
        emit(data, True)
        return
    status = "created" if result.created else ("updated" if result.changed else "unchanged")
    click.echo(str(result.plan.revision))
    click.echo(f"plan {namespace.name}/{kind} {status} (revision {result.plan.revision})", err=True)
    if not data["policy_confirmed"]:
        click.echo(
            f"warning: policy unconfirmed: plan confirms revision {result.plan.policy_revision}, "
            f"latest is {latest}; ticks create no job until it is confirmed",
            err=True,
        )


@plan_group.command("list")
@click.argument("ns", required=False)
@json_option
def plan_list(ns: str | None, as_json: bool) -> None:
    """List plans (of NS, or of every namespace)."""
    with platform_engine().connect() as conn:
        now = db_now(conn)
        if ns is None:
            names = {n.id: n.name for n in list_namespaces(conn)}
            plans = plan_store.list_plans(conn)
        else:
            namespace = resolve_namespace(conn, ns)
            names = {namespace.id: namespace.name}
            plans = plan_store.list_plans(conn, namespace.id)
        rows = [
            _view(
                p,
                names.get(p.namespace_id, p.namespace_id.hex()),
                plan_store.latest_policy_revision(conn, p.namespace_id, p.kind),
                now,
            )
            for p in plans
        ]
    if as_json:
        emit_list(rows, True, [])
        return
    table = [
        {
            "namespace": r["namespace"],
            "kind": r["kind"],
            "rev": r["revision"],
            "enabled": "yes" if r["enabled"] else "no",
            "interval": format_duration(r["interval_seconds"]),
            "next_run_at": r["next_run_at"],
            "policy": f"{r['policy_revision']}/{r['latest_policy_revision']}"
            + ("" if r["policy_confirmed"] else " UNCONFIRMED"),
            "active_job": r["active_job_id"] or "-",
        }
        for r in rows
    ]
    emit_list(
        table,
        False,
        ["namespace", "kind", "rev", "enabled", "interval", "next_run_at", "policy", "active_job"],
    )


@plan_group.command("show")
@click.argument("ns")
@click.argument("kind")
@json_option
def plan_show(ns: str, kind: str, as_json: bool) -> None:
    """Show one plan, with its schedule, active job and policy confirmation."""
    schedule.validate_kind(kind)
    with platform_engine().connect() as conn:
        now = db_now(conn)
        namespace = resolve_namespace(conn, ns)
        plan = plan_store.get_plan(conn, namespace.id, kind)
        if plan is None:
            raise NotFound(f"namespace {namespace.name!r} has no {kind!r} plan")
        latest = plan_store.latest_policy_revision(conn, namespace.id, kind)
    data = _view(plan, namespace.name, latest, now)
    data.update(_show_backlog(plan))
    if as_json:
        emit(data, True)
        return
    lines = [
        f"plan            {namespace.name}/{kind}",
        f"namespace_id    {data['namespace_id']}",
        f"revision        {plan.revision}",
        f"enabled         {'yes' if plan.enabled else 'no'}",
        f"storage_id      {data['storage_id']}",
        f"interval        {format_duration(plan.interval_seconds)} ({plan.interval_seconds}s)",
        f"batch_size      {plan.batch_size}",
        f"max_bytes       {format_size(plan.max_bytes)} ({plan.max_bytes})",
        f"next_run_at     {data['next_run_at']}" + (" (due)" if data["due"] else ""),
        f"active_job_id   {data['active_job_id'] or '-'}",
        f"backlog         {_backlog_text(data)}",
        f"policy          confirmed revision {plan.policy_revision}, latest {latest}"
        + ("" if data["policy_confirmed"] else "  ** POLICY UNCONFIRMED: no new jobs **"),
        f"created_at      {data['created_at']}",
        f"updated_at      {data['updated_at']}",
    ]
    click.echo("\n".join(lines))


@plan_group.command("run")
@click.argument("ns")
@click.argument("kind")
@json_option
def plan_run(ns: str, kind: str, as_json: bool) -> None:
    """Archive now: make the plan of NS and KIND due now and wake the tick.

    The next tick creates the job; the plan's schedule keeps its phase (the run after this job is
    the one it had scheduled). Refused (exit 3) for a disabled plan, an unconfirmed policy, an
    active job or a namespace that is not ACTIVE; nothing is written then.
    """
    schedule.validate_kind(kind)
    settings = get_settings()
    with platform_engine().begin() as conn:
        namespace = resolve_namespace(conn, ns)
        now = db_now(conn)
        result = plan_store.run_plan(conn, namespace.id, kind, now=now, actor=settings.actor)
        latest = plan_store.latest_policy_revision(conn, namespace.id, kind)
    log_action(log, "archive.plan.run", namespace_id=namespace.id, kind=kind)
    try:
        publish_tick(settings.tick_seconds)
        woken = True
    except Exception as exc:  # broker unavailable: beat's next tick creates the job anyway
        log_action(
            log, "archive.plan.tick_wakeup_failed", logging.WARNING, error=type(exc).__name__
        )
        woken = False
    data = _view(result.plan, namespace.name, latest, now)
    data["scheduled_before"] = iso_utc(result.scheduled_before)
    data["next_scheduled"] = iso_utc(result.next_scheduled)
    data["tick_woken"] = woken
    if as_json:
        emit(data, True)
        return
    click.echo(
        f"plan {namespace.name}/{kind} is due now; "
        + ("the tick was woken" if woken else "the next tick (beat) creates its job")
        + f"; the next scheduled run stays {data['next_scheduled']}"
    )


@plan_group.command("preview")
@click.argument("ns")
@click.argument("kind")
@json_option
def plan_preview_cmd(ns: str, kind: str, as_json: bool) -> None:
    """Show what a job of NS and KIND created now would archive; writes nothing.

    The range by the SPEC §5 rule, exact counts of its roots and children, bytes and files
    estimated from a sample of its roots, and what the next tick would do with the plan.
    """
    schedule.validate_kind(kind)
    settings = get_settings()
    primary, src_engine = platform_engine(), source_engine()
    with primary.connect() as conn:
        namespace = resolve_namespace(conn, ns)
        plan = plan_store.get_plan(conn, namespace.id, kind)
        if plan is None:
            raise NotFound(f"namespace {namespace.name!r} has no {kind!r} plan")
        conn.rollback()  # read only: nothing to commit
    job = plan_preview.prospective_job(plan, plan.updated_at)  # its scope: storage, ns, kind
    controls = plan_preview.controls_now(primary, job, settings, DB_CLOCK)
    data = _preview(plan, controls).to_dict()
    data["namespace"] = namespace.name
    data["source"] = "primary" if src_engine is primary else "replica"
    if as_json:
        emit(data, True)
        return
    click.echo(_preview_text(data))


def _preview(
    plan: plan_store.Plan, controls: plan_preview.ControlsNow | None = None, children: bool = True
) -> plan_preview.Preview:
    """The preview of ``plan``'s next job, read on the primary and the source; writes nothing."""
    primary, src_engine = platform_engine(), source_engine()
    with primary.connect() as conn:
        if src_engine is primary:
            result = plan_preview.preview(
                conn, conn, plan, DB_CLOCK, controls=controls, children=children
            )
        else:
            with src_engine.connect() as src:
                result = plan_preview.preview(
                    conn, src, plan, DB_CLOCK, controls=controls, replica=True, children=children
                )
                src.rollback()
        conn.rollback()  # read only: nothing to commit
    return result


def _show_backlog(plan: plan_store.Plan) -> dict[str, Any]:
    """``plan show``'s backlog; a source that does not answer (a replica that is down) leaves
    it unknown, with the reason, and the plan is still shown."""
    try:
        return _preview(plan, children=False).backlog()
    except Exception as exc:
        if not is_transient_db(exc):
            raise
        unknown = dict.fromkeys(plan_preview.BACKLOG_FIELDS)
        return {**unknown, "backlog_unavailable": f"source unreachable ({type(exc).__name__})"}


def _backlog_text(d: dict[str, Any]) -> str:
    """One line of the catch-up: roots and bytes not yet archived, jobs, time at the rate."""
    if d.get("backlog_unavailable"):
        return f"-  ({d['backlog_unavailable']})"
    if d["backlog_roots"] is None:
        return "-  (no range: the plan's policy revision row is gone)"
    if d["backlog_roots"] == 0:
        return "none (caught up)"
    size = "-" if d["backlog_bytes"] is None else f"~{format_size(d['backlog_bytes'])}"
    jobs = "?" if d["backlog_jobs"] is None else str(d["backlog_jobs"])
    if d["backlog_eta_seconds"] is None:
        eta = "time unknown (no SUCCEEDED job measured yet)"
    else:
        eta = (
            f"~{format_duration(max(1, round(d['backlog_eta_seconds'])))} at "
            f"{d['rate_roots_per_second']} roots/s"
        )
    return f"{d['backlog_roots']} roots, {size}, {jobs} job(s) at max_bytes, {eta}"


def _preview_text(d: dict[str, Any]) -> str:
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    children = ", ".join(f"{t} {n}" for t, n in sorted(d["children"].items())) or "-"
    if d["policy_missing"]:
        rng = "-  ** POLICY_MISSING: the plan's policy revision row is gone **"
    else:
        rng = f"[{d['range_from'] or 'beginning'}, {d['range_until']})"
    if d["estimated_bytes"] is None:
        est_bytes, est_files = "-", "-"
    else:
        est_bytes = (
            f"~{format_size(d['estimated_bytes'])} ({d['estimated_bytes']}; "
            f"{d['bytes_per_root']} B/root from {d['sample_roots']} sampled roots)"
            + ("  ** OVER max_bytes **" if d["over_budget"] else "")
        )
        est_files = f"~{d['estimated_files']} (manifest + batches of ~{d['roots_per_file']} roots)"
    active = d["active_job_id"] or "-"
    if d["active_job_id"]:
        active += f" ({d['active_job_state'] or 'missing'})"
    lines = [
        f"plan            {d['namespace']}/{d['kind']} (revision {d['plan_revision']})",
        f"now             {d['now']}",
        f"range           {rng}",
        f"roots           {d['roots']}",
        f"children        {children}",
        f"bytes           {est_bytes}",
        f"files           {est_files}",
        f"max_bytes       {format_size(d['max_bytes'])} ({d['max_bytes']})",
        f"batch_size      {d['batch_size']}",
        f"source          {d['source']}",
        f"enabled         {yes(d['enabled'])}",
        f"policy          revision {d['policy_revision']}, latest "
        f"{d['latest_policy_revision']}"
        + ("" if d["policy_confirmed"] else "  ** POLICY UNCONFIRMED: no new jobs **"),
        f"due             {yes(d['due'])} (next_run_at {d['next_run_at']})",
        f"active_job      {active}",
        f"backlog         {_backlog_text(d)}",
        f"next tick       {d['tick_action']}",
        f"controls        {_controls_text(d)}",
    ]
    if d["replica_beat_at"] is not None or d["source"] == "replica":
        lines.append(f"replica beat    {d['replica_beat_at'] or '- (none applied yet)'}")
    return "\n".join(lines)


def _controls_text(d: dict[str, Any]) -> str:
    parts = []
    if d["paused"]:
        parts.append("PAUSED")
    if d["throttled"]:
        parts.append(f"throttled to {d['max_roots_per_second']} roots/s")
    windows = [w for c in d["controls"] if c["control"] == ControlKind.WINDOW for w in c["windows"]]
    if windows:
        where = "OUTSIDE" if d["outside_window"] else "inside"
        parts.append(f"{where} its window ({' '.join(windows)} UTC)")
    text = ", ".join(parts) or "none in force"
    return text + (f"; a claim now would wait: {d['wait_now']}" if d["wait_now"] else "")


def register(cli: click.Group) -> None:
    cli.add_command(plan_group)
