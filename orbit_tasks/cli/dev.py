"""``orbit dev seed-history``: realistic history rows for demos, tests and benchmarks.

All rows of one run are inserted in one transaction (all or nothing), in chunks of
``generator.CHUNK_ROOTS`` roots per ``executemany``. The clock is the database's.
"""

from __future__ import annotations

import random

import click

from orbit_tasks.cli.common import DecimalParam, IntegerParam, emit, json_option
from orbit_tasks.db.engine import db_now
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.dev import generator
from orbit_tasks.platform import store

DEFAULT_QUEUE = "default"


@click.group("dev")
def dev_group() -> None:
    """Developer tools (demo and benchmark data)."""


@dev_group.command("seed-history")
@click.argument("ns")
@click.option("--kind", required=True, help="History kind (tasks, workflows, events, ...).")
@click.option(
    "--roots", type=IntegerParam(), required=True, help=f"Root rows (1..{generator.MAX_ROOTS})."
)
@click.option(
    "--children",
    type=IntegerParam(),
    default=None,
    help=f"Children per settled root (0..{generator.MAX_CHILDREN}; default "
    f"{generator.DEFAULT_CHILDREN} for kinds with children, 0 otherwise).",
)
@click.option(
    "--days",
    type=IntegerParam(),
    default=30,
    show_default=True,
    help=f"Spread settled times over this many days (1..{generator.MAX_DAYS}).",
)
@click.option("--random-ids", is_flag=True, help="16 random bytes instead of UUIDv7 ids.")
@click.option(
    "--settled-fraction",
    type=DecimalParam(0.0, 1.0),
    default=0.8,
    show_default=True,
    help="Share of settled roots (0.0..1.0).",
)
@click.option("--seed", type=IntegerParam(), default=None, help="Random seed (reproducible rows).")
@json_option
def seed_history(
    ns: str,
    kind: str,
    roots: int,
    children: int | None,
    days: int,
    random_ids: bool,
    settled_fraction: float,
    seed: int | None,
    as_json: bool,
) -> None:
    """Insert ROOTS generated history roots of KIND (and their children) into NS.

    Tasks need a queue: the namespace's queues are used, and a queue named "default" is created
    if it has none.
    """
    spec = generator.make_spec(kind, roots, children, days, random_ids, settled_fraction)
    rng = random.Random(seed)
    queue_created = False
    with platform_engine().begin() as conn:
        namespace = store.resolve_namespace(conn, ns)
        queue_ids: list[bytes] = []
        if kind == "tasks":
            queue_ids = [q.id for q in store.list_queues(conn, namespace.id)]
            if not queue_ids:
                queue_ids = [store.create_queue(conn, namespace.id, DEFAULT_QUEUE)]
                queue_created = True
        result = generator.seed_history(conn, spec, namespace.id, queue_ids, rng, db_now(conn))
    data = {
        "namespace_id": namespace.id.hex(),
        "kind": result.kind,
        "table": result.table,
        "roots": result.roots,
        "settled": result.settled,
        "unsettled": result.unsettled,
        "children": result.children,
        "queue_created": queue_created,
    }
    kids = "".join(f", {n} {t} rows" for t, n in result.children.items())
    emit(
        data,
        as_json,
        f"{result.table}: {result.roots} roots ({result.settled} settled, "
        f"{result.unsettled} unsettled){kids}",
    )


def register(cli: click.Group) -> None:
    cli.add_command(dev_group)
