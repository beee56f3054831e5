"""``orbit sender ...``: the business database of the outbox sender and its operator commands."""

from __future__ import annotations

import click

from orbit_tasks.cli.common import emit, json_option
from orbit_tasks.db.migrate import upgrade
from orbit_tasks.db.registry import business_engine


@click.group("sender")
def sender_group() -> None:
    """Outbox sender (business database)."""


@sender_group.group("db")
def sender_db() -> None:
    """Business database (not part of the platform migrations)."""


@sender_db.command("upgrade")
@json_option
def sender_db_upgrade(as_json: bool) -> None:
    """Create or upgrade the sender tables in the business database."""
    upgrade(business_engine(), "business")
    emit({"database": "business", "revision": "head"}, as_json, "business database is up to date")


def register(cli: click.Group) -> None:
    cli.add_command(sender_group)
