"""Entry point of the ``orbit`` console script."""

from __future__ import annotations

import importlib

import click

from orbit_tasks import __version__
from orbit_tasks.cli.common import OrbitGroup
from orbit_tasks.logs import configure_from_settings

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
    "restore",  # adds `restore` to the job and archive groups
    "worker",
    "demo",
    "flower",
    "metrics",
]


@click.group(cls=OrbitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orbit")
def cli() -> None:
    """Operate the Orbit archive and outbox sender (SPEC §9)."""
    # One-shot commands log warnings and errors only unless ORBIT_LOG_LEVEL says otherwise;
    # long-running ones (api serve, flower) reconfigure with their own default (SPEC §12).
    configure_from_settings("WARNING")


for _name in COMMAND_MODULES:
    importlib.import_module(f"orbit_tasks.cli.{_name}").register(cli)


def main() -> None:
    cli(prog_name="orbit")
