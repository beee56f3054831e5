"""``orbit archive tick``: one archive tick now, the same code as beat's task (SPEC §7, §9)."""

from __future__ import annotations

import click

from orbit_tasks.archive.tick import run_tick
from orbit_tasks.cli.common import LazyGroup, emit, json_option
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.settings import get_settings


@click.group("archive", cls=LazyGroup, lazy={"restore": "orbit_tasks.cli.restore:archive_restore"})
def archive_group() -> None:
    """History archive."""


@archive_group.command("tick")
@json_option
def archive_tick(as_json: bool) -> None:
    """Run one tick: create jobs for due plans, then publish wake-ups (to CELERY_BROKER_URL)."""
    report = run_tick(platform_engine(), get_settings())
    data = report.to_dict()
    if as_json:
        emit(data, True)
        return
    lines = [
        f"storages {report.storages}, jobs created {len(report.jobs_created)}, "
        f"coalesced {len(report.coalesced)}, wake-ups published {report.wakeups_published}"
    ]
    lines += [f"created job {j} for {ns}/{k}" for ns, k, j in report.jobs_created]
    lines += [f"policy unconfirmed: {ns}/{k} (no job)" for ns, k in report.policy_unconfirmed]
    lines += [
        f"namespace not active: {ns}/{k} (run skipped)" for ns, k in report.namespace_inactive
    ]
    click.echo("\n".join(lines))


def register(cli: click.Group) -> None:
    cli.add_command(archive_group)
