"""Shared CLI plumbing: error -> exit code mapping, ``--json`` output, argument parsing.

Exit codes (SPEC §9): 0 ok, 2 usage/invalid input, 3 conflict, 4 not found, 1 other.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click
from sqlalchemy.exc import DBAPIError, OperationalError

from orbit_tasks.db.faults import LOCK_CONFLICT_CODES
from orbit_tasks.errors import InvalidInput, OrbitError
from orbit_tasks.units import parse_duration, parse_size


class OrbitGroup(click.Group):
    """A click group that turns project errors into their exit codes and one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OrbitError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except OperationalError as exc:
            click.echo(f"error: {describe_operational_error(exc)}", err=True)
            ctx.exit(1)
        except DBAPIError as exc:
            click.echo(f"error: database refused the change ({type(exc.orig).__name__})", err=True)
            ctx.exit(1)


# MySQL client/server codes that mean "cannot reach or use the server", not "bad statement".
_UNAVAILABLE_CODES = {1040, 1045, 1049, 1053, 2002, 2003, 2005, 2006, 2013, 2055}


def describe_operational_error(exc: OperationalError) -> str:
    """One line for the operator, without SQL text or parameters (they may hold business data)."""
    args = getattr(exc.orig, "args", ())
    code = args[0] if args else None
    if isinstance(code, int):
        if code in _UNAVAILABLE_CODES:
            return f"database unavailable (driver code {code})"
        if code == 4025:
            return "database refused the change: a CHECK constraint failed (driver code 4025)"
        if code in LOCK_CONFLICT_CODES:
            return f"database busy (lock wait or deadlock, driver code {code}); retry"
        return f"database error (driver code {code})"
    text = str(code or "")
    if "no such table" in text:
        return "database schema missing: run `orbit db upgrade` (or `orbit sender db upgrade`)"
    if "locked" in text:
        return "database busy (SQLite file locked); retry"
    if "unable to open" in text:
        return "database unavailable (cannot open the SQLite file)"
    return f"database error ({type(exc.orig).__name__})"


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
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value
