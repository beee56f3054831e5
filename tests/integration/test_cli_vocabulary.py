"""One vocabulary (issue 27, docs/cli.md "One vocabulary"): a walk over every command's options
(lazily loaded groups included) checks that durations, sizes, integers, word choices, reasons
and servers use the one type each; then the operator's first hour, with the real CLI on the real
MariaDB: durations with a unit, ASCII digits, one reason rule, nothing written on a refusal, the
same busy-port line for every server, the broker named and redacted, ``credential revoke NS ID``,
an unsupported database driver refused."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from sqlalchemy import Engine, func, select, text

from orbit_tasks.cli.common import (
    PORT,
    DecimalParam,
    DurationParam,
    IntegerParam,
    LazyGroup,
    ReasonParam,
    SizeParam,
    WordChoice,
)
from orbit_tasks.cli.main import load_all_commands
from orbit_tasks.db.platform_tables import archive_controls, archive_policies, credentials
from tests.support.archive_jobs import make_due, make_namespace, make_plan, make_volume
from tests.support.cli import assert_one_line_error, invoke_json, orbit_env, run_orbit

# --- the walk -----------------------------------------------------------------------------------

#: The naming rule of durations (docs/cli.md "One vocabulary"): a long option is a duration
#: when its name ends in ``-after`` (not the cursor ``--after``), ``-age``, ``-seconds``,
#: ``-ttl``, ``-delay``, ``-period`` or ``-lease``, or contains ``interval``, ``timeout``,
#: ``-than`` (``--older-than``) or ``-wait``; plus the names listed in KNOWN_DURATIONS.
DURATION_NAME = re.compile(
    r"^--(?:.+-after|.*-age|.*-seconds|.*-ttl|.*-delay|.*-period|.*-lease"
    r"|.*interval.*|.*timeout.*|.*-than|.*-wait.*)$"
)
KNOWN_DURATIONS = {"--purge-offline-workers"}  # Flower's name: an age, not spelled so
#: Sizes: a long option whose name holds ``bytes`` or ends in ``-size``, except counts.
SIZE_NAME = re.compile(r"^--(?:.*bytes.*|.*-size)$")
COUNTS_NOT_SIZES = {"--batch-size"}  # roots per file
#: Servers: one --host/--port (cli/common.server_options) and one busy-port line.
SERVERS = {("api", "serve"), ("metrics", "serve"), ("flower",), ("console", "serve")}
#: click's own number types read Unicode digits and spaces (Python's int() and float()).
CLICK_NUMBERS = (click.types.IntParamType, click.types.FloatParamType)


def walk(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` as ``("orbit job watch", command)``, looked up with
    ``get_command`` so that lazily loaded groups (LazyGroup) and their commands are included."""
    ctx = click.Context(group, info_name=" ".join(path) or "orbit")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, (path, name)
        yield " ".join(("orbit", *path, name)), command
        if isinstance(command, click.Group):
            yield from walk(command, (*path, name))


def violations(group: click.Group) -> list[str]:
    """What breaks the one vocabulary, one line per option (empty: nothing)."""
    found = []
    for where, command in walk(group):
        names = {o for p in command.params for o in getattr(p, "opts", [])}
        for param in command.params:
            kind = param.type
            long = max(getattr(param, "opts", []) or [""], key=len)
            at = f"{where} {long or param.human_readable_name}"
            if isinstance(kind, CLICK_NUMBERS):
                found.append(f"{at}: click's {kind.name} (use IntegerParam or DecimalParam)")
            if isinstance(kind, click.Choice) and not (
                isinstance(kind, WordChoice) and not kind.case_sensitive
            ):
                found.append(f"{at}: a case-sensitive choice (use WordChoice)")
            if (DURATION_NAME.match(long) or long in KNOWN_DURATIONS) and not isinstance(
                kind, DurationParam
            ):
                found.append(f"{at}: a duration without DurationParam ({kind.name})")
            sized = SIZE_NAME.match(long) and long not in COUNTS_NOT_SIZES
            if sized and not isinstance(kind, SizeParam):
                found.append(f"{at}: a size without SizeParam ({kind.name})")
            if long == "--reason" and not isinstance(kind, ReasonParam):
                found.append(f"{at}: a reason without ReasonParam ({kind.name})")
        if tuple(where.split()[1:]) in SERVERS:
            port = next((p for p in command.params if "--port" in getattr(p, "opts", [])), None)
            if "--host" not in names or port is None or port.type is not PORT:
                found.append(f"{where}: a server without server_options (--host, --port)")
    return found


def test_every_option_speaks_the_one_vocabulary() -> None:
    cli = load_all_commands()
    assert violations(cli) == []
    walked = {where for where, _ in walk(cli)}
    # lazily loaded groups and commands are walked too
    assert {"orbit sender db upgrade", "orbit archive restore", "orbit job restore"} <= walked
    assert {"orbit api serve", "orbit metrics serve", "orbit flower"} <= walked
    kinds = {type(p.type) for _, c in walk(cli) for p in c.params}
    assert {DurationParam, SizeParam, IntegerParam, DecimalParam, WordChoice, ReasonParam} <= kinds


def test_every_command_renders_its_help() -> None:
    cli = load_all_commands()
    for where, command in walk(cli):
        ctx = click.Context(command, info_name=where)
        assert "Usage:" in command.get_help(ctx), where


@click.command("stray")
@click.option("--retry-after", type=int, help="a duration as a bare int")
@click.option("--poll-interval", type=click.FloatRange(0.1, 5))
@click.option("--chunk-bytes", type=int)
@click.option("--mode", type=click.Choice(["fast", "slow"]))
@click.option("--reason", required=True)
@click.option("--count", type=click.IntRange(1, 9))
def _stray(**_: Any) -> None:
    """A command that breaks every rule (loaded lazily, as `job restore` is)."""


@click.command("serve")
@click.option("--bind", default="127.0.0.1")
@click.option("--port", type=click.IntRange(1, 65535))
def _stray_server(**_: Any) -> None:
    """A server with its own --bind/--port."""


def test_the_walk_fails_a_new_option_that_breaks_the_vocabulary() -> None:
    @click.group()
    def root() -> None:
        pass

    @root.group(
        "later", cls=LazyGroup, lazy={"stray": "tests.integration.test_cli_vocabulary:_stray"}
    )
    def later() -> None:
        pass

    @root.group("console")
    def console() -> None:
        pass

    console.add_command(_stray_server)
    assert sorted(violations(root)) == sorted(
        [
            "orbit later stray --retry-after: a duration without DurationParam (integer)",
            "orbit later stray --retry-after: click's integer (use IntegerParam or DecimalParam)",
            "orbit later stray --poll-interval: click's float range (use IntegerParam or "
            "DecimalParam)",
            "orbit later stray --poll-interval: a duration without DurationParam (float range)",
            "orbit later stray --chunk-bytes: click's integer (use IntegerParam or DecimalParam)",
            "orbit later stray --chunk-bytes: a size without SizeParam (integer)",
            "orbit later stray --mode: a case-sensitive choice (use WordChoice)",
            "orbit later stray --reason: a reason without ReasonParam (text)",
            "orbit later stray --count: click's integer range (use IntegerParam or DecimalParam)",
            "orbit console serve --port: click's integer range (use IntegerParam or DecimalParam)",
            "orbit console serve: a server without server_options (--host, --port)",
        ]
    )


# --- the operator's first hour, on MariaDB -------------------------------------------------


@pytest.fixture
def world(mariadb_url: str, business_engine: Engine, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A migrated platform and business database on MariaDB, a namespace ``acme`` with a storage
    and a plan, and the CLI's environment."""
    from tests.support.db import migrated_engine

    business_url = business_engine.url.render_as_string(hide_password=False)
    with migrated_engine(mariadb_url, "platform") as engine:
        ns_id, _queue = make_namespace(engine, "acme")
        volume = tmp_path / "vol"
        volume.mkdir()
        storage_id = make_volume(engine, volume, "vol")
        env = orbit_env(mariadb_url, business_url, ORBIT_VAR_DIR=str(tmp_path / "var"))
        yield {"engine": engine, "env": env, "ns_id": ns_id, "storage_id": storage_id,
               "business": business_engine, "tmp": tmp_path}  # fmt: skip


def _count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_durations_take_a_unit_everywhere(world: dict[str, Any]) -> None:
    env, engine = world["env"], world["engine"]
    job = "0" * 32
    # `job watch --interval 5s` was refused ("'5s' is not a valid float range"): now it parses,
    # and the unknown job is what is wrong (exit 4)
    watched = run_orbit(["job", "watch", "acme", job, "--interval", "5s", "--timeout", "1m"], env)
    assert_one_line_error(watched, 4, f"job {job} does not exist")
    # a bare number is not read as seconds (`--archive-after 30` was 30 s): one line, exit 2
    before = _count(engine, archive_policies)
    bare = run_orbit(["policy", "set", "acme", "tasks", "--archive-after", "30"], env)
    assert_one_line_error(bare, 2, "'--archive-after'", "'30'", "the number needs a unit")
    sized = run_orbit(["plan", "set", "acme", "tasks", "--max-bytes", "1048576"], env)
    assert_one_line_error(sized, 2, "'--max-bytes'", "'1048576'", "the number needs a unit")
    assert _count(engine, archive_policies) == before  # nothing written
    assert (
        run_orbit(["policy", "set", "acme", "tasks", "--archive-after", "30d"], env).returncode == 0
    )
    assert _count(engine, archive_policies) == before + 1


def test_word_choices_ignore_case(world: dict[str, Any]) -> None:
    env = world["env"]
    assert invoke_json(["job", "list", "acme", "--state", "succeeded"], env)["items"] == []
    assert invoke_json(["sender", "list", "--state", "review"], env)["items"] == []
    wrong = run_orbit(["sender", "list", "--state", "lost"], env)
    assert_one_line_error(wrong, 2, "'--state'", "'lost'", "'REVIEW'", "(any case)")


@pytest.mark.parametrize(
    "args",
    [
        ["throttle", "--namespace", "acme", "--max-roots-per-second", "\uff11\uff10"],  # １０
        ["throttle", "--namespace", "acme", "--max-roots-per-second", " 10"],
        ["throttle", "--namespace", "acme", "--max-roots-per-second", "+10"],
        ["window", "--namespace", "acme", "\uff10\uff11:\uff10\uff10-\uff10\uff12:\uff10\uff10"],
        ["window", "--namespace", "acme", " 01:00-02:00"],
    ],
)
def test_numbers_are_ascii_digits_and_nothing_is_written(
    world: dict[str, Any], args: list[str]
) -> None:
    proc = run_orbit(["archive", *args], world["env"])
    line = assert_one_line_error(proc, 2, repr(args[-1]))
    assert "ASCII digits" in line
    assert _count(world["engine"], archive_controls) == 0


def test_ascii_numbers_are_saved(world: dict[str, Any]) -> None:
    env = world["env"]
    done = invoke_json(["archive", "throttle", "--namespace", "acme", "--max-roots-per-second",
                        "10"], env)  # fmt: skip
    assert done["max_roots_per_second"] == 10
    done = invoke_json(["archive", "window", "--namespace", "acme", "01:00-02:00"], env)
    assert done["windows"] == "01:00-02:00"


REASONS = [
    ("r\nsecond line", "the non-printable character U+000A at position 1 (a control character)"),
    ("\t", "the non-printable character U+0009 at position 0 (a control character)"),
    ("ab\udcffc", "the text is not valid UTF-8: the byte 0xFF at position 2"),  # argv b"ab\xffc"
    (" ", "the text is blank (allowed 1.."),
]


@pytest.mark.parametrize(("reason", "needle"), REASONS)
def test_one_reason_rule_for_every_command(world: dict[str, Any], reason: str, needle: str) -> None:
    env = world["env"]
    paused = run_orbit(["archive", "pause", "--reason", reason], env)
    assert_one_line_error(paused, 2, "invalid value for '--reason'", needle)
    assert _count(world["engine"], archive_controls) == 0
    resolved = run_orbit(
        ["sender", "resolve", "--code", "QUEUE_FORBIDDEN", "--reason", reason], env
    )
    assert_one_line_error(resolved, 2, "invalid value for '--reason'", needle)
    with world["business"].connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM sender_resolutions")).scalar_one() == 0


def test_unsupported_driver_is_refused_and_mariadb_still_works(
    world: dict[str, Any], mariadb_url: str
) -> None:
    env = dict(world["env"])
    scheme, rest = mariadb_url.split("://", 1)
    env["ORBIT_DATABASE_URL"] = f"mysql+pymysql://{rest}"
    refused = run_orbit(["namespace", "list"], env)
    assert_one_line_error(
        refused, 2, "ORBIT_DATABASE_URL", "names the driver 'pymysql'",
        "allowed: mysql://, mysql+mysqldb://, mariadb://, mariadb+mysqldb:// or sqlite:///",
    )  # fmt: skip
    env["ORBIT_DATABASE_URL"] = f"mariadb://{rest}"  # used as mysql+mysqldb:// (documented)
    listed = run_orbit(["namespace", "list", "--json"], env)
    assert listed.returncode == 0 and '"acme"' in listed.stdout, listed.stderr


def test_credential_revoke_takes_ns_like_create_and_list(world: dict[str, Any]) -> None:
    env, engine = world["env"], world["engine"]
    make_namespace(engine, "globex")
    mine = invoke_json(["credential", "create", "acme"], env)["id"]
    theirs = invoke_json(["credential", "create", "globex"], env)["id"]
    old_form = run_orbit(["credential", "revoke", mine], env)
    assert_one_line_error(old_form, 2, "credential revoke takes NS ID")
    elsewhere = run_orbit(["credential", "revoke", "acme", theirs], env)
    assert_one_line_error(elsewhere, 4, f"credential {theirs} does not exist in namespace acme")
    with engine.connect() as conn:
        revoked = conn.execute(
            select(func.count()).where(credentials.c.revoked_at.is_not(None))
        ).scalar_one()
    assert revoked == 0  # neither was revoked
    done = invoke_json(["credential", "revoke", "acme", mine], env)
    assert done["id"] == mine and done["namespace_id"] == world["ns_id"].hex()
    listed = invoke_json(["credential", "list", "acme"], env)["items"]
    assert [c["id"] for c in listed if c["revoked_at"]] == [mine]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_broker_unavailable_names_the_setting_redacted(world: dict[str, Any]) -> None:
    engine = world["engine"]
    make_plan(engine, world["ns_id"], "tasks", world["storage_id"])
    make_due(engine, world["ns_id"], "tasks")
    port = _closed_port()
    env = {**world["env"], "CELERY_BROKER_URL": f"amqp://orbit:s3cret@127.0.0.1:{port}//"}
    proc = run_orbit(["archive", "tick"], env, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]  # after the tick's own warning log line
    assert line.startswith("error: message broker unavailable (OperationalError) "), line
    assert f"[CELERY_BROKER_URL 'amqp://***@127.0.0.1:{port}//']" in line, line
    assert "s3cret" not in proc.stderr + proc.stdout


# --- servers: one --host/--port, one busy-port line ---------------------------------------

SERVER_COMMANDS = {
    "api serve": ["api", "serve"],
    "metrics serve": ["metrics", "serve"],
    "flower": ["flower", "--no-auth"],
    "console serve": ["console", "serve"],
}


@pytest.mark.parametrize("name", sorted(SERVER_COMMANDS))
def test_a_busy_port_is_one_line_exit_3_for_every_server(name: str, tmp_path: Path) -> None:
    env = orbit_env(f"sqlite:///{tmp_path / 'platform.sqlite3'}", ORBIT_VAR_DIR=str(tmp_path))
    with socket.socket() as holder:  # another process's server, listening
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        proc = run_orbit(
            [*SERVER_COMMANDS[name], "--host", "127.0.0.1", "--port", str(port)],
            env, cwd=tmp_path, timeout=60,
        )  # fmt: skip
    assert_one_line_error(
        proc, 3, f"cannot listen on 127.0.0.1:{port}: the port is in use by another process"
    )
    assert not (tmp_path / "platform.sqlite3").exists()  # refused before anything else
