"""Entry point of the ``orbit`` console script.

Command groups load on first use: ``orbit archive tick`` imports the archive commands and what
they need, never the API server, Flower, the restore engine of every kind or the demo
(issue 19: a one-shot command starts in 0.25 s; docs/architecture.md "Imports inside a
function"). ``orbit --help`` lists every command and so loads them all."""

from __future__ import annotations

import importlib

import click

from orbit_tasks import __version__
from orbit_tasks.cli.common import OrbitGroup
from orbit_tasks.logs import configure_from_settings

# Each top-level command and the modules (``orbit_tasks.cli.<name>``, each with
# ``register(cli)``) that build it, in order
# (`job restore` and `archive restore` load lazily from their groups: cli/common.LazyGroup).
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "db": ("db",),
    "sender": ("sender",),
    "api": ("api",),
    "plan": ("plan",),
    "archive": ("archive",),
    "namespace": ("namespace",),
    "storage": ("storage",),
    "policy": ("policy",),
    "queue": ("queue",),
    "credential": ("credential",),
    "dev": ("dev",),
    "job": ("job",),
    "worker": ("worker",),
    "beat": ("worker",),
    "demo": ("demo",),
    "flower": ("flower",),
    "metrics": ("metrics",),
    "console": ("console",),
}


class LazyOrbitGroup(OrbitGroup):
    """The top-level group: a command's modules are imported when it is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            for module in COMMAND_MODULES[cmd_name]:
                importlib.import_module(f"orbit_tasks.cli.{module}").register(self)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyOrbitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orbit")
def cli() -> None:
    """Operate the Orbit archive and outbox sender (SPEC §9)."""
    # One-shot commands log warnings and errors only unless ORBIT_LOG_LEVEL says otherwise;
    # long-running ones (api serve, flower) reconfigure with their own default (SPEC §12).
    configure_from_settings("WARNING")


def load_all_commands() -> click.Group:
    """The top-level group with every command registered (for walking ``.commands``)."""
    for name in COMMAND_MODULES:
        cli.get_command(click.Context(cli), name)
    return cli


def main() -> None:
    cli(prog_name="orbit")
