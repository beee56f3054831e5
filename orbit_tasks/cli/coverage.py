"""``orbit archive coverage NS KIND | --all``: what the archive covers (issue 28 item 2) -- the
archived ranges in order with their job, storage, roots, files, bytes and last verification,
every gap or overlap between SUCCEEDED jobs (exit 1), and the backlog of settled history not
yet archived (the plan preview's count). Reads only: one statement per plan for its jobs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from sqlalchemy import Connection

from orbit_tasks.archive import coverage as rules
from orbit_tasks.archive.engine.preview import PREVIEW_JOB_ID
from orbit_tasks.archive.jobs import JobFailure
from orbit_tasks.archive.ranges import ArchiveRange, Bound
from orbit_tasks.archive.store import coverage as store
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.store import source
from orbit_tasks.cli.common import emit, emit_table, json_option
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.faults import is_transient_db
from orbit_tasks.db.registry import platform_engine, source_engine
from orbit_tasks.errors import InvalidInput, NotFound
from orbit_tasks.platform.history import history_kind
from orbit_tasks.platform.store import list_namespaces, list_storages, resolve_namespace
from orbit_tasks.timestamps import format_optional, format_ts, parse_ts
from orbit_tasks.units import format_size


def _bound(b: Bound | None) -> dict[str, Any] | None:
    if b is None:
        return None
    return {"at": format_ts(b[0]), "id": None if b[1] is None else b[1].hex()}


def _bound_text(b: Bound | None, start: bool) -> str:
    if b is None:
        return "(start)" if start else "?"
    return format_ts(b[0]) + ("" if b[1] is None else f"#{b[1].hex()[:8]}")


def _range_item(r: rules.ArchivedRange, labels: dict[str, str]) -> dict[str, Any]:
    j = r.job
    storage = j.storage_id.hex()
    return {
        "job_id": j.job_id.hex(), "storage_id": storage, "storage": labels.get(storage, ""),
        "from": _bound(r.start), "until": _bound(r.end), "range_source": r.source.value,
        "empty": r.empty, "roots": j.roots, "files": j.batches + 1, "bytes": j.bytes,
        "succeeded_at": format_ts(j.succeeded_at), "last_verified": format_ts(r.last_verified),
        "last_scrub": None if j.outcome is None else {
            "checked_at": format_optional(j.checked_at), "outcome": j.outcome,
            "first_bad_file": j.first_bad_file or None,
        },
    }  # fmt: skip


def _hole_item(h: rules.Hole) -> dict[str, Any]:
    return {
        "kind": h.kind.value, "from": _bound(h.start), "until": _bound(h.end),
        "after_job": None if h.before is None else h.before.hex(), "before_job": h.after.hex(),
    }  # fmt: skip


Counter = Callable[[Connection, plan_store.Plan, ArchiveRange], int]


def source_count(conn: Connection, plan: plan_store.Plan, rng: ArchiveRange) -> int:
    """A backlog's roots on the archive's source, as the plan preview counts them: on the
    platform connection itself when there is no replica (SQLite: no second connection), else
    on the replica."""
    src = source_engine()
    if src is platform_engine():
        return source.count_roots(conn, plan.kind, plan.namespace_id, rng)
    with src.connect() as replica:
        return source.count_roots(replica, plan.kind, plan.namespace_id, rng)


def _backlog(conn: Connection, plan: plan_store.Plan, count: Counter) -> dict[str, Any]:
    """The plan preview's backlog: roots settled before the policy's ``until`` and after the
    greatest archived end (the range of a job created now)."""
    now = db_now(conn)
    try:
        rng = job_store.range_at(
            conn, plan.namespace_id, plan.kind, plan.policy_revision, now, PREVIEW_JOB_ID
        )
    except JobFailure:
        return {"from": None, "until": None, "roots": None, "unavailable": "policy row missing"}
    doc: dict[str, Any] = {
        "from": _bound(rng.start), "until": _bound(rng.end), "roots": None, "unavailable": None,
    }  # fmt: skip
    try:
        doc["roots"] = count(conn, plan, rng)
    except Exception as exc:
        if not is_transient_db(exc):
            raise
        doc["unavailable"] = f"source unreachable ({type(exc).__name__})"
    return doc


def plan_coverage(
    conn: Connection, plan: plan_store.Plan, name: str, labels: dict[str, str], count: Counter
) -> dict[str, Any]:
    """The coverage document of one plan (``count``: the backlog's roots on the source)."""
    ranges = rules.archived_ranges(store.covered_jobs(conn, plan.namespace_id, plan.kind))
    found = rules.holes(ranges)
    return {
        "namespace": name, "namespace_id": plan.namespace_id.hex(), "kind": plan.kind,
        "ok": not found, "ranges": [_range_item(r, labels) for r in ranges],
        "gaps": [_hole_item(h) for h in found if h.kind is rules.HoleKind.GAP],
        "overlaps": [_hole_item(h) for h in found if h.kind is rules.HoleKind.OVERLAP],
        "roots": sum(r.job.roots for r in ranges), "bytes": sum(r.job.bytes for r in ranges),
        "backlog": _backlog(conn, plan, count),
    }  # fmt: skip


def _print(doc: dict[str, Any]) -> None:
    click.echo(
        f"{doc['namespace']}/{doc['kind']}: {len(doc['ranges'])} archived range(s), "
        f"{doc['roots']} roots, {format_size(doc['bytes'])}"
    )
    rows = [
        {
            "from": _bound_text(_unbound(r["from"]), True),
            "until": _bound_text(_unbound(r["until"]), False),
            "job": r["job_id"],
            "storage": r["storage"] or r["storage_id"][:12],
            "roots": r["roots"],
            "files": r["files"],
            "bytes": r["bytes"],
            "verified": r["last_verified"]
            + (
                ""
                if r["last_scrub"] is None or r["last_scrub"]["outcome"] != "bad"
                else f" (BAD: {r['last_scrub']['first_bad_file']})"
            ),
        }  # fmt: skip
        for r in doc["ranges"]
    ]
    emit_table(rows, ["from", "until", "job", "storage", "roots", "files", "bytes", "verified"])
    out = []
    for h in doc["gaps"] + doc["overlaps"]:
        out.append(
            f"{h['kind'].upper()}: {_bound_text(_unbound(h['from']), True)} .. "
            f"{_bound_text(_unbound(h['until']), False)} (after job {h['after_job'] or '-'}, "
            f"before job {h['before_job']})"
        )
    b = doc["backlog"]
    if b["unavailable"]:
        out.append(f"backlog: unknown ({b['unavailable']})")
    else:
        out.append(
            f"backlog: {b['roots']} roots settled from {_bound_text(_unbound(b['from']), True)} "
            f"until {_bound_text(_unbound(b['until']), False)} not yet archived"
        )
    click.echo("\n".join(out))


def _unbound(doc: dict[str, Any] | None) -> Bound | None:
    if doc is None:
        return None
    return parse_ts(doc["at"]), None if doc["id"] is None else bytes.fromhex(doc["id"])


@click.command("coverage")
@click.argument("ns", required=False)
@click.argument("kind", required=False)
@click.option("--all", "everything", is_flag=True, help="Every plan of every namespace.")
@json_option
def archive_coverage(ns: str | None, kind: str | None, everything: bool, as_json: bool) -> None:
    """Archived ranges of a plan in order (job, storage, roots, files, bytes, last verified),
    gaps and overlaps between SUCCEEDED jobs (exit 1), and the backlog; --all: every plan."""
    if everything and ns is not None:
        raise InvalidInput("give NS KIND or --all, not both")
    if not everything and (ns is None or kind is None):
        raise InvalidInput("give NS KIND (a namespace and a history kind), or --all")
    if kind is not None:
        history_kind(kind)  # unknown: one line with the allowed kinds, exit 2
    count = source_count
    with platform_engine().connect() as conn:
        labels = {s["storage_id"]: str(s["label"] or "") for s in list_storages(conn)}
        if everything:
            names = {n.id: n.name for n in list_namespaces(conn)}
            plans = sorted(
                plan_store.list_plans(conn), key=lambda p: (names.get(p.namespace_id, ""), p.kind)
            )
            docs = [
                plan_coverage(conn, p, names.get(p.namespace_id, ""), labels, count) for p in plans
            ]
        else:
            assert ns is not None and kind is not None
            namespace = resolve_namespace(conn, ns)
            plan = plan_store.get_plan(conn, namespace.id, kind)
            if plan is None:
                raise NotFound(f"namespace {namespace.name!r} has no {kind} plan")
            docs = [plan_coverage(conn, plan, namespace.name, labels, count)]
        conn.rollback()  # read only
    ok = all(d["ok"] for d in docs)
    if as_json:
        emit({"items": docs, "next": None, "ok": ok} if everything else docs[0], True)
    else:
        if everything and not docs:
            click.echo("(no plans)")
        for doc in docs:
            _print(doc)
    if not ok:
        raise SystemExit(1)
