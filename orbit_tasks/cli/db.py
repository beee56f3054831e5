"""``orbit db upgrade``: apply the platform migration chain."""

from __future__ import annotations

import click

from orbit_tasks.cli.common import emit, json_option
from orbit_tasks.db.migrate import upgrade
from orbit_tasks.db.registry import platform_engine


@click.group("db")
def db_group() -> None:
    """Platform database."""


@db_group.command("upgrade")
@json_option
def db_upgrade(as_json: bool) -> None:
    """Create or upgrade the platform schema (archive + platform tables)."""
    upgrade(platform_engine(), "platform")
    emit({"database": "platform", "revision": "head"}, as_json, "platform database is up to date")


def register(cli: click.Group) -> None:
    cli.add_command(db_group)
