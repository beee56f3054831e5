"""``orbit db upgrade|check|current`` and ``orbit sender db upgrade|check|current`` (SPEC §12).

The same three commands for both chains; ``cli/sender.py`` mounts :data:`sender_db_group` under
``orbit sender``. docs/schema.md describes adoption and what is compared.
"""

from __future__ import annotations

from collections.abc import Callable

import click
from sqlalchemy import Engine

from orbit_tasks.cli.common import emit, json_option
from orbit_tasks.db.migrate import current, upgrade
from orbit_tasks.db.registry import business_engine, platform_engine
from orbit_tasks.db.schema_check import Chain, chain_spec, head_revision, inspect_schema


def _commands(group: click.Group, chain: Chain, engine: Callable[..., Engine]) -> None:
    spec = chain_spec(chain)
    where = f"the {spec.database}"

    @group.command("upgrade")
    @json_option
    def db_upgrade(as_json: bool) -> None:
        result = upgrade(engine(create=True), chain)  # the one command that creates a file
        emit(result.to_json(), as_json, result.message())

    db_upgrade.help = (
        f"Create or upgrade {where}. Tables that already exist (created by hand from the seed DDL "
        "or by another tool) are adopted when they match; if one differs nothing is changed and "
        "the differences are listed (exit 3). Never drops, alters or rewrites a table."
    )

    @group.command("check")
    @json_option
    def db_check(as_json: bool) -> None:
        report = inspect_schema(engine(), chain)
        emit(report.to_json(), as_json, "\n".join(report.lines()))
        if not report.ok:
            click.get_current_context().exit(1)

    db_check.help = (
        f"Check {where} against this release's schema. Exit 0 when it is at head and every "
        "table matches, else 1 with the differences, table by table."
        + (
            " Tables without a migration record pass by shape alone."
            if not spec.record_required
            else ""
        )
    )

    @group.command("current")
    @json_option
    def db_current(as_json: bool) -> None:
        recorded = current(engine(), chain)
        head = head_revision(chain)
        data = {"database": chain, "revision": recorded, "head": head, "at_head": recorded == head}
        human = (
            f"{spec.database}: revision {recorded}"
            + (" (head)" if recorded == head else f" (head {head})")
            if recorded
            else f"{spec.database}: no revision recorded (head {head})"
        )
        emit(data, as_json, human)

    db_current.help = f"Print the schema revision recorded in {where}."


@click.group("db")
def db_group() -> None:
    """Platform database schema (archive + platform tables)."""


@click.group("db")
def sender_db_group() -> None:
    """Business database schema (the sender's tables; not part of the platform migrations)."""


_commands(db_group, "platform", platform_engine)
_commands(sender_db_group, "business", business_engine)


def register(cli: click.Group) -> None:
    cli.add_command(db_group)
