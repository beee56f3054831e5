"""``orbit db upgrade|check|current`` and ``orbit sender db upgrade|check|current`` (SPEC §12).

The same three commands for both chains; ``cli/sender.py`` mounts :data:`sender_db_group` under
``orbit sender``. docs/schema.md describes adoption and what is compared.

Each says which database it used (issue 27): ``--json`` always carries ``location`` (the SQLite
file's absolute path or the redacted URL, and the variable it came from); the human output adds
a ``database:`` line when the variable is not set, i.e. when the command used the embedded
default under ``ORBIT_VAR_DIR`` -- the one case where an operator may not know which database
that was (``db upgrade`` there creates a new, empty SQLite file beside the demo's or the real one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from sqlalchemy import Engine

from orbit_tasks.cli.common import emit, json_option
from orbit_tasks.db.migrate import current, upgrade
from orbit_tasks.db.registry import (
    business_engine,
    describe_database,
    is_default_url,
    platform_engine,
)
from orbit_tasks.db.schema_check import Chain, chain_spec, head_revision, inspect_schema
from orbit_tasks.settings import get_settings

VARIABLES: dict[Chain, str] = {
    "platform": "ORBIT_DATABASE_URL",
    "business": "ORBIT_SENDER_DATABASE_URL",
}


def _located(chain: Chain, data: dict[str, Any], human: str) -> tuple[dict[str, Any], str]:
    """``data`` with the database's ``location``; ``human`` with a ``database:`` line when the
    command used the default (its variable not set)."""
    settings = get_settings()
    variable = VARIABLES[chain]
    url = settings.database_url if chain == "platform" else settings.sender_database_url
    where = describe_database(url, variable)
    if is_default_url(url, variable):
        human = f"{human}\ndatabase: {where}"
    return {**data, "location": where}, human


def _commands(group: click.Group, chain: Chain, engine: Callable[..., Engine]) -> None:
    spec = chain_spec(chain)
    where = f"the {spec.database}"

    @group.command("upgrade")
    @json_option
    def db_upgrade(as_json: bool) -> None:
        result = upgrade(engine(create=True), chain)  # the one command that creates a file
        data, human = _located(chain, result.to_json(), result.message())
        emit(data, as_json, human)

    db_upgrade.help = (
        f"Create or upgrade {where}. Tables that already exist (created by hand from the seed DDL "
        "or by another tool) are adopted when they match; if one differs nothing is changed and "
        "the differences are listed (exit 3). Never drops, alters or rewrites a table."
    )

    @group.command("check")
    @json_option
    def db_check(as_json: bool) -> None:
        report = inspect_schema(engine(), chain)
        data, human = _located(chain, report.to_json(), "\n".join(report.lines()))
        emit(data, as_json, human)
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
        data, human = _located(chain, data, human)
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
