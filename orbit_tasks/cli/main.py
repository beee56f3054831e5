"""Entry point of the ``orbit`` console script."""

from __future__ import annotations

import importlib
import logging
import os

import click

from orbit_tasks import __version__
from orbit_tasks.cli.common import OrbitGroup

# One module per command group; each has ``register(cli)``.
COMMAND_MODULES = [
    "db",
    "sender",
    "api",
    "plan",
    "archive",
    "namespace",
    "storage",
    "policy",
    "queue",
    "credential",
    "dev",
    "job",
    "worker",
    "demo",
    "metrics",
]


@click.group(cls=OrbitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orbit")
def cli() -> None:
    """Operate the Orbit archive and outbox sender (SPEC §9)."""
    logging.basicConfig(
        level=os.environ.get("ORBIT_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


for _name in COMMAND_MODULES:
    importlib.import_module(f"orbit_tasks.cli.{_name}").register(cli)


def main() -> None:
    cli(prog_name="orbit")
