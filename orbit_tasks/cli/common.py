"""Shared CLI plumbing: error -> exit code mapping, ``--json`` output, argument parsing.

Exit codes (SPEC §9): 0 ok, 2 usage/invalid input, 3 conflict, 4 not found, 1 other.
"""

from __future__ import annotations

import errno
import importlib
import json
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from orbit_tasks.error_lines import describe_error, describe_usage_error
from orbit_tasks.errors import ConflictError, InvalidInput, OrbitError
from orbit_tasks.timestamps import format_ts
from orbit_tasks.units import (
    INTEGER_FORMS,
    ascii_decimal,
    ascii_int,
    format_duration,
    format_size,
    parse_duration,
    parse_int,
    parse_size,
    parse_text,
    shown,
)

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
            message, code = describe_error(exc, broker_url=_broker_url())
            log.debug("command failed", exc_info=True)
            click.echo(f"error: {message}", err=True)
            ctx.exit(code)


def _broker_url() -> str | None:
    """CELERY_BROKER_URL as the command read it (None when the settings cannot be read)."""
    try:
        from orbit_tasks.settings import get_settings

        return get_settings().broker_url
    except Exception:  # noqa: BLE001 - a line about the broker, not about the settings
        return None


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


# --- the one vocabulary of values (issue 27, docs/cli.md "One vocabulary") ------------------------
# Every option and argument that takes a duration, a size, an integer, a word choice or a
# reason uses one of these types (tests/integration/test_cli_vocabulary.py walks every command
# and checks it); each parses through the one parser of orbit_tasks/units.py. A refusal is one
# line naming the option, the value and what is allowed, exit 2 (click's UsageError).


def _flag(param: click.Parameter | None, fallback: str) -> str:
    """How a message names the parameter: its longest flag (``--interval``), else its name."""
    if param is None:
        return fallback
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    return param.human_readable_name


class _Vocabulary(click.ParamType):
    """A type of the one vocabulary: :meth:`parse` returns the value or raises InvalidInput."""

    metavar = "VALUE"

    def parse(self, value: str, what: str) -> Any:
        raise NotImplementedError

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return self.metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: Any) -> Any:
        if not isinstance(value, str):
            return value  # already converted (a default given as a number, a second pass)
        what = _flag(param, self.name)
        try:
            return self.parse(value, what)
        except InvalidInput as exc:
            # click names the option ("invalid value for '--interval': ..."): not twice
            self.fail(str(exc).removeprefix(f"{what} "), param, ctx)


def _ranged(
    value: int, what: str, lo: int | None, hi: int | None, fmt: Callable[[int], str]
) -> int:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        low = "" if lo is None else fmt(lo)
        high = "" if hi is None else fmt(hi)
        raise InvalidInput(f"{what} {fmt(value)} is out of range (allowed {low}..{high})")
    return value


class DurationParam(_Vocabulary):
    """``<digits><s|m|h|d>`` -> seconds (int), a unit always (units.parse_duration), optionally
    within ``lo..hi`` seconds."""

    name = "duration"
    metavar = "DURATION"

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi

    def parse(self, value: str, what: str) -> int:
        return _ranged(parse_duration(value, what), what, self.lo, self.hi, format_duration)


class SizeParam(_Vocabulary):
    """``<digits><B|KiB|MiB|GiB>`` -> bytes, a unit always (units.parse_size)."""

    name = "size"
    metavar = "SIZE"

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi

    def parse(self, value: str, what: str) -> int:
        return _ranged(parse_size(value, what), what, self.lo, self.hi, format_size)


class IntegerParam(_Vocabulary):
    """An integer of ASCII digits within ``lo..hi`` (units.parse_int): click's INT and IntRange
    read ``１０`` and ``' 10'`` as 10 (Python's int())."""

    name = "integer"
    metavar = "N"

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi

    def parse(self, value: str, what: str) -> int:
        if self.lo is not None and self.hi is not None:
            return parse_int(value, what, self.lo, self.hi)
        number = ascii_int(value)  # the range is the rule's (a store names it)
        if number is None:
            raise InvalidInput(f"{what} {shown(value)} is not an integer ({INTEGER_FORMS})")
        return _ranged(number, what, self.lo, self.hi, str)


class DecimalParam(_Vocabulary):
    """A decimal number of ASCII digits (``0.8``) within ``lo..hi`` (click's FLOAT reads
    ``０.８``, ``1e3`` and ``nan``)."""

    name = "decimal"
    metavar = "NUMBER"

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi

    def parse(self, value: str, what: str) -> float:
        number = ascii_decimal(value)
        allowed = f"allowed {self.lo:g}..{self.hi:g}"
        if number is None:
            raise InvalidInput(
                f"{what} {shown(value)} is not a number ({allowed}; {INTEGER_FORMS})"
            )
        if not self.lo <= number <= self.hi:
            raise InvalidInput(f"{what} {value} is out of range ({allowed})")
        return number


class ReasonParam(_Vocabulary):
    """Free text that is stored and printed (``--reason``): 1..max_chars characters of printable
    text on one line, the sender's rule (units.text_refusal)."""

    name = "reason"
    metavar = "TEXT"

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars

    def parse(self, value: str, what: str) -> str:
        return parse_text(value, "the text", self.max_chars)


class WordChoice(click.Choice):
    """A choice among words, case-insensitive (``--state review`` is ``REVIEW``); the value
    passed on is the choice as spelled in ``choices``."""

    def __init__(self, choices: Any) -> None:
        super().__init__([str(c) for c in choices], case_sensitive=False)

    def get_invalid_choice_message(self, value: Any, ctx: click.Context | None) -> str:
        # the choices as spelled (click lists them lowercased when case-insensitive)
        allowed = ", ".join(repr(c) for c in self.choices)
        return f"{value!r} is not one of {allowed} (any case)"


SIZE = SizeParam()
DURATION = DurationParam()
PORT = IntegerParam(1, 65535)


# --- servers: one --host/--port and one busy-port line (issue 27 item 3) ---------------------


def server_options(default_port: int, *, aliases: tuple[str, ...] = ()) -> Callable[..., Any]:
    """``--host`` (default 127.0.0.1) and ``--port`` of every server (``api serve``, ``metrics
    serve``, ``flower``, ``console serve``); ``aliases`` keeps an older name of ``--host``
    working (flower's ``--address``). Call :func:`check_listen` before starting the server."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option(
            "--port",
            type=PORT,
            default=default_port,
            show_default=True,
            help="TCP port to listen on (1..65535).",
        )(fn)
        return click.option(
            "--host",
            *aliases,
            "host",
            default="127.0.0.1",
            show_default=True,
            help="Address to listen on (0.0.0.0: every IPv4 address).",
        )(fn)

    return decorate


def check_listen(host: str, port: int) -> None:
    """Refuse, before a server starts, an address it cannot listen on, with one line naming
    ``host:port``: in use by another process (exit 3: ConflictError), not an address of this
    machine or a privileged port (exit 2). Binds a probe socket as the servers do (with
    SO_REUSEADDR: a port left in TIME_WAIT is free) and closes it."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        raise InvalidInput(
            f"cannot listen on {where}: the host name does not resolve (--host)"
        ) from None
    family, kind, proto, _, address = infos[0]
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
        probe.listen(1)
    except OSError as exc:
        raise listen_error(where, exc) from None
    finally:
        probe.close()


def listen_error(where: str, exc: OSError) -> Exception:
    """The one line of a server that cannot listen on ``where`` (``host:port``)."""
    if exc.errno == errno.EADDRINUSE:
        return ConflictError(
            f"cannot listen on {where}: the port is in use by another process (choose another "
            "--port, or stop that process)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return InvalidInput(
            f"cannot listen on {where}: permission denied (ports below 1024 need privileges; "
            "choose another --port)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return InvalidInput(f"cannot listen on {where}: not an address of this machine (--host)")
    return OrbitError(f"cannot listen on {where}: {exc.strerror or exc}")


def fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def iso_utc(value: Any) -> Any:
    """A naive-UTC ``datetime`` as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (other values unchanged)."""
    if hasattr(value, "strftime"):
        return format_ts(value)
    return value
