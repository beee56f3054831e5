"""Shared CLI plumbing: error -> exit code mapping, ``--json`` output, argument parsing.

Exit codes (SPEC §9): 0 ok, 2 usage/invalid input, 3 conflict, 4 not found, 1 other.
"""

from __future__ import annotations

import errno
import importlib
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from orbit_tasks.error_lines import describe_error, describe_usage_error
from orbit_tasks.errors import InvalidInput
from orbit_tasks.timestamps import format_ts
from orbit_tasks.units import parse_duration, parse_size

log = logging.getLogger("orbit.cli.common")


def _refuse_usage(ctx: click.Context, exc: click.ClickException) -> None:
    message, code = describe_usage_error(exc)
    click.echo(f"error: {message}", err=True)
    ctx.exit(code)


class LazyGroup(click.Group):
    """A command group whose heavier subcommands are imported on first use: ``lazy`` maps a
    subcommand name to ``"module:attribute"`` (``orbit archive tick`` never loads the restore
    engine behind ``orbit archive restore``)."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, attribute = self.lazy[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)


class OrbitGroup(click.Group):
    """The CLI's error boundary: every exception of a command becomes ONE line on stderr and its
    exit code (SPEC §9; :func:`orbit_tasks.error_lines.describe_error`). No traceback reaches an
    operator; with ``ORBIT_LOG_LEVEL=DEBUG`` an unexpected one is logged with its traceback.
    Click's own usage errors (bad option values, missing options, unknown commands) become one
    line too (:func:`orbit_tasks.error_lines.describe_usage_error`), not click's usage block; a
    group called without its command still prints its help."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # the top-level options (`orbit --bogus`): parsed before :meth:`invoke`
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.exceptions.ClickException as exc:
            _refuse_usage(ctx, exc)
            raise AssertionError("unreachable") from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise  # `orbit job`: the group's help, as click prints it
        except click.exceptions.ClickException as exc:
            _refuse_usage(ctx, exc)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise  # explicit exits and ^C: click exits itself
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
                raise  # stdout closed by the reader (`| head`): click exits quietly
            message, code = describe_error(exc)
            log.debug("command failed", exc_info=True)
            click.echo(f"error: {message}", err=True)
            ctx.exit(code)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(fn)


def emit(data: Any, as_json: bool, human: Callable[[Any], str] | str | None = None) -> None:
    """Print ``data`` as JSON (``--json``) or via ``human`` (a string or a formatter)."""
    if as_json:
        click.echo(json.dumps(data, sort_keys=True, ensure_ascii=False, default=str))
        return
    if human is None:
        click.echo(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str))
    elif callable(human):
        click.echo(human(data))
    else:
        click.echo(human)


def emit_list(
    items: list[dict[str, Any]],
    as_json: bool,
    columns: list[str],
    *,
    next_cursor: str | None = None,
) -> None:
    """Every list command prints one shape (docs/cli.md): with ``--json`` the object
    ``{"items": [...], "next": cursor-or-null}``; for people a table, then the next-page hint
    when the list was cut."""
    if as_json:
        emit({"items": items, "next": next_cursor}, True)
        return
    emit_table(items, columns)
    if next_cursor is not None:
        click.echo(f"more: next page with --after {next_cursor}")


def emit_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """A plain aligned table for people (``--json`` prints the rows instead)."""
    if not rows:
        click.echo("(none)")
        return
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    click.echo("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for r in rows:
        click.echo("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns).rstrip())


class SizeParam(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return parse_size(value, what=f"--{param.name.replace('_', '-')}" if param else "size")
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


class DurationParam(click.ParamType):
    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return parse_duration(
                value, what=f"--{param.name.replace('_', '-')}" if param else "duration"
            )
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeParam()
DURATION = DurationParam()


def fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def iso_utc(value: Any) -> Any:
    """A naive-UTC ``datetime`` as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (other values unchanged)."""
    if hasattr(value, "strftime"):
        return format_ts(value)
    return value
