"""``orbit metrics serve``: the Prometheus exporter (SPEC §12, docs/metrics.md)."""

from __future__ import annotations

import click

from orbit_tasks.cli.common import check_listen, server_options
from orbit_tasks.settings import get_settings

# Outside the Prometheus exporter port registry's 9100-9999 (fully allocated), and neither
# celery-exporter's 9808 (danihodovic) nor 9540 (OvalMoney), Flower's 5555 or Prometheus' 9090.
DEFAULT_PORT = 10108


@click.group("metrics")
def metrics_group() -> None:
    """Prometheus exporter of archive, outbox and broker state."""


@metrics_group.command("serve")
@server_options(DEFAULT_PORT)  # not celery-exporter's 9808: docs/metrics.md
def serve(host: str, port: int) -> None:
    """Serve /metrics in the Prometheus text format, read at scrape time (cached for
    ORBIT_METRICS_CACHE_SECONDS, each source bounded by ORBIT_METRICS_TIMEOUT_SECONDS)."""
    check_listen(host, port)  # a busy port: one line, exit 3 (docs/cli.md "Servers")
    # Imported here: the exporter and Celery (~0.5 s) cost every other `orbit` command.
    from orbit_tasks.celery_app import app
    from orbit_tasks.metrics import server

    running = server.start(server.build_collector(get_settings(), app), host, port)
    click.echo(f"orbit metrics: serving http://{host}:{running.port}/metrics", err=True)
    server.serve_until_signal(running)


def register(cli: click.Group) -> None:
    cli.add_command(metrics_group)
