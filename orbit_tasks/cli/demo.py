"""``orbit demo``: end to end on the embedded default (see ``orbit_tasks/dev/demo.py``)."""

from __future__ import annotations

from pathlib import Path

import click

from orbit_tasks.dev.demo import run_demo


@click.command("demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("var/demo"),
    show_default=True,
    help="Where the demo's databases, volume, broker and logs go: a new or empty directory, or "
    "one of an earlier demo (emptied first).",
)
def demo_command(directory: Path) -> None:
    """Run the archive and the outbox sender end to end with no servers."""
    run_demo(directory)


def register(cli: click.Group) -> None:
    cli.add_command(demo_command)
