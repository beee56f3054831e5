"""The first hour of an operator (issue 27): real `orbit` processes, MariaDB, Redis, a worker.

* README's walkthrough from nothing on MariaDB: its SQL block (database, the platform's user,
  the least-privilege archiver) runs as written, with other names; an archive job runs end to
  end on a worker connected as the archiver, who can read the history and cannot change it.
* Without ``ORBIT_DATABASE_URL`` an error names the database it looked at and the safe next
  step, never ``run `orbit db upgrade``` (which would create a second, empty database), and
  writes nothing; the ``db`` commands say which database they used.
* ``make demo`` installs only what the demo needs (``scripts/bootstrap.sh --demo``), and the
  demo's closing lines say how to look at its state: the printed commands work as printed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.platform.history import source_table_names
from tests.support.archive_jobs import (
    archive_env,
    assert_succeeded_exactly,
    create_job,
    wait_state,
)
from tests.support.cli import assert_one_line_error, orbit_env, run_orbit
from tests.support.db import MARIADB_SERVER_URL
from tests.support.scene import archive_scene

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / ".venv" / "bin" / "orbit"


# --- README: from nothing on MariaDB, a least-privilege archiver ------------------------------


def readme_sql() -> list[str]:
    """The statements of README's first-hour SQL block, in order (comments dropped)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- first-hour-sql", 1)[1].split("```sql\n", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("--")]
    return [s.strip() for s in " ".join(lines).split(";") if s.strip()]


@contextmanager
def readme_database() -> Iterator[tuple[str, str, str, list[str]]]:
    """README's block with a random database and user names: (platform URL, archiver URL,
    admin URL of the database, the archiver's GRANTs -- to run after ``db upgrade``, as README
    says). Everything it made is dropped afterwards."""
    tag = secrets.token_hex(4)
    db, platform, archiver = f"orbit_fh_{tag}", f"orbit_fh_{tag}", f"orbit_fha_{tag}"
    names = {"db": db, "platform": platform, "archiver": archiver}

    def renamed(stmt: str) -> str:
        stmt = stmt.replace("'orbit_archiver'@", f"'{names['archiver']}'@")
        stmt = stmt.replace("'orbit'@", f"'{names['platform']}'@")
        stmt = stmt.replace("CREATE DATABASE orbit ", f"CREATE DATABASE `{db}` ")
        return re.sub(r"\bON orbit\.", f"ON `{db}`.", stmt)

    statements = [renamed(s) for s in readme_sql()]
    later = [s for s in statements if s.startswith("GRANT") and f"'{archiver}'@" in s]
    admin = create_engine(MARIADB_SERVER_URL)
    server = make_url(MARIADB_SERVER_URL)
    host = f"{server.host}:{server.port or 3306}"
    try:
        with admin.begin() as conn:
            for stmt in statements:
                if stmt not in later:
                    conn.execute(text(stmt))
        yield (
            f"mysql+mysqldb://{platform}:platform-secret@{host}/{db}",
            f"mysql+mysqldb://{archiver}:archiver-secret@{host}/{db}",
            f"{MARIADB_SERVER_URL}/{db}",
            later,
        )
    finally:
        with admin.begin() as conn:
            for user in (platform, archiver):
                conn.execute(text(f"DROP USER IF EXISTS '{user}'@'%'"))
            conn.execute(text(f"DROP DATABASE IF EXISTS `{db}`"))
        admin.dispose()


def test_readme_sql_block_is_the_least_privilege_the_archiver_gets() -> None:
    """The archiver's grants on the history are SELECT only, on every table the archive reads
    and nothing else of it; its writes are the archive's job tables only."""
    grants = [s for s in readme_sql() if "'orbit_archiver'@" in s and s.startswith("GRANT")]
    tables = [g for g in grants if " ON orbit.* " not in g]
    on: dict[str, str] = {}
    for g in tables:
        table = re.search(r" ON orbit\.(\w+) ", g).group(1)  # type: ignore[union-attr]
        on[table] = f"{on[table]} + {g.split(' ON ')[0]}" if table in on else g.split(" ON ")[0]
    for table in source_table_names():
        # issue 28: a failed scrub adds its audit event (INSERT only: no history row changes)
        wanted = "GRANT SELECT + GRANT INSERT" if table == "orbit_audit_events" else "GRANT SELECT"
        assert on.pop(table) == wanted, table
    assert on.pop("orbit_credentials") == "GRANT REFERENCES"  # its definition, not a token hash
    writes = {
        t for t, privileges in on.items() if privileges not in ("GRANT SELECT", "GRANT REFERENCES")
    }
    assert writes == {
        "orbit_archive_plans",
        "orbit_archive_jobs",
        "orbit_archive_job_waits",
        "orbit_archive_job_ends",
        "orbit_archive_job_checks",
        "orbit_archive_throttle_buckets",
        "orbit_archive_job_indexes",
        "orbit_archive_scrubs",
        "orbit_archive_scrub_leases",
    }
    # every table of the platform chain has a grant: the worker's schema start check compares
    # each one's definition, and MariaDB shows it only to a user with a privilege on it
    from orbit_tasks.db.schema_check import chain_spec

    spec = chain_spec("platform")
    head = spec.head_metadata() if callable(spec.head_metadata) else spec.head_metadata
    granted = set(re.findall(r" ON orbit\.(\w+) ", " ".join(f"{g} " for g in grants)))
    missing = set(head.tables) | {spec.version_table}
    missing -= granted
    assert not missing, f"README's archiver has no grant on {sorted(missing)} (add REFERENCES)"
    # table by table; database-wide only SHOW VIEW (no rows: MariaDB shows CHECKs with it)
    wide = [g for g in grants if " ON orbit.* " in g]
    assert wide == ["GRANT SHOW VIEW ON orbit.* TO 'orbit_archiver'@'%'"], wide


@pytest.mark.mariadb
@pytest.mark.redis
@pytest.mark.slow
def test_a_least_privilege_archiver_runs_an_archive_job_end_to_end(tmp_path: Path) -> None:
    with readme_database() as (platform_url, archiver_url, admin_url, archiver_grants):
        env = orbit_env(platform_url, f"sqlite:///{tmp_path / 'b.sqlite3'}")
        up = run_orbit(["db", "upgrade"], env)  # as the platform's user: it may create tables
        assert up.returncode == 0, up.stderr
        admin = create_engine(admin_url)
        with admin.begin() as conn:  # README: the archiver's table grants after the upgrade
            for stmt in archiver_grants:
                conn.execute(text(stmt))
        admin.dispose()
        platform = create_engine(platform_url)
        archiver = create_engine(archiver_url)
        try:
            with archive_env(platform_url, platform, tmp_path) as ae:
                ns, _q, vol, _sid = archive_scene(
                    platform, name="least", volume=tmp_path / "vol", kind="tasks", roots=60,
                    batch_size=10,
                ).parts  # fmt: skip
                ae.worker("archiver", [vol], extra_env={"ORBIT_DATABASE_URL": archiver_url})
                job = create_job(ae, ns, "tasks")  # the tick: the platform's user
                done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=120)
                assert done.state is JobState.SUCCEEDED, (done, ae.workers[0].text()[-3000:])
                assert done.roots > 0 and done.attempts == done.batches + 1
                assert_succeeded_exactly(ae, done, vol)
                verified = ae.orbit(
                    "job", "verify", ns.hex(), done.id.hex(), "--volume", str(vol), check=False
                )
                assert verified.returncode == 0, verified.stderr
            # the archiver reads the history and cannot change it (1142: command denied)
            with archiver.connect() as conn:
                assert conn.execute(text("SELECT COUNT(*) FROM orbit_tasks")).scalar_one() == 60
                for stmt in (
                    "DELETE FROM orbit_tasks",
                    "UPDATE orbit_task_attempts SET attempt_no = attempt_no",
                    "INSERT INTO orbit_events (namespace_id) VALUES (x'00')",
                    "UPDATE orbit_namespaces SET name = name",
                    "DELETE FROM orbit_archive_plans",
                    "SELECT * FROM orbit_credentials",
                    "DROP TABLE orbit_events",
                ):
                    with pytest.raises((OperationalError, ProgrammingError)) as denied:
                        conn.execute(text(stmt))
                    assert denied.value.orig.args[0] == 1142, (stmt, denied.value)  # type: ignore[union-attr]
                    conn.rollback()
        finally:
            platform.dispose()
            archiver.dispose()


# --- which database: errors and the db commands -------------------------------------------------


def _bare_env(**extra: str) -> dict[str, str]:
    """No ORBIT_* variable at all (the operator's first shell), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CELERY_"))}
    return {**env, **extra}


def test_without_a_database_url_the_error_names_the_default_and_the_safe_step(
    tmp_path: Path,
) -> None:
    """Before: "ORBIT_DATABASE_URL '...': the database file does not exist; run `orbit db
    upgrade`" -- the one step that creates a second, empty database beside the real one."""
    env = _bare_env()
    default = tmp_path / "var" / "platform.sqlite3"
    for args in (["job", "list", "acme"], ["namespace", "list"], ["db", "check"]):
        proc = run_orbit(args, env, cwd=tmp_path)
        line = assert_one_line_error(
            proc, 1, str(default), "ORBIT_DATABASE_URL is not set", "ORBIT_VAR_DIR=var/demo"
        )
        assert "run `orbit db upgrade`" not in line, line
        assert "would create a new, empty database" in line, line
    proc = run_orbit(["sender", "list"], env, cwd=tmp_path)
    line = assert_one_line_error(
        proc, 1, str(tmp_path / "var" / "business.sqlite3"), "ORBIT_SENDER_DATABASE_URL is not set"
    )
    assert "run `orbit sender db upgrade`" not in line, line
    assert sorted(os.listdir(tmp_path)) == []  # nothing written: no var/, no empty file


def test_the_db_commands_say_which_database_they_used(tmp_path: Path) -> None:
    env = _bare_env(ORBIT_VAR_DIR=str(tmp_path / "here"))
    where = f"{tmp_path / 'here' / 'platform.sqlite3'} (ORBIT_DATABASE_URL is not set"
    up = run_orbit(["db", "upgrade"], env, cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines()[-1].startswith(f"database: {where}"), up.stdout
    for args in (["db", "current"], ["db", "check"]):
        human = run_orbit(args, env, cwd=tmp_path)
        assert human.returncode == 0 and f"database: {where}" in human.stdout, human.stdout
        located = json.loads(run_orbit([*args, "--json"], env, cwd=tmp_path).stdout)
        assert located["location"].startswith(where), located
    # set explicitly: the operator chose it; `--json` still names it, the text stays as it was
    named = _bare_env(ORBIT_DATABASE_URL=f"sqlite:///{tmp_path / 'here' / 'platform.sqlite3'}")
    human = run_orbit(["db", "current"], named, cwd=tmp_path)
    assert human.returncode == 0 and "\ndatabase:" not in human.stdout, human.stdout
    located = json.loads(run_orbit(["db", "current", "--json"], named, cwd=tmp_path).stdout)
    assert located["location"] == f"{tmp_path / 'here' / 'platform.sqlite3'} (ORBIT_DATABASE_URL)"


# --- make demo: what it installs, what it says last --------------------------------------------

TEST_TOOLS = {"chromium", "docker-compose", "prometheus", "iptables", "mariadb-server-core", "jq"}


def test_make_demo_installs_only_what_the_demo_needs() -> None:
    def listed(*args: str) -> set[str]:
        done = subprocess.run(
            ["bash", "scripts/bootstrap.sh", *args, "--list"],
            cwd=REPO, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return set(done.stdout.split())

    demo, everything = listed("--demo"), listed()
    assert not demo & TEST_TOOLS, demo
    assert demo == {"libmariadb-dev", "pkg-config", "gcc"}  # mysqlclient, a package dependency
    assert everything >= TEST_TOOLS and demo <= everything
    dry = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True)
    assert "bootstrap.sh --demo" in dry.stdout and "orbit demo" in dry.stdout, dry.stdout
    for target in ("test", "lint"):
        dry = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
        assert re.search(r"bootstrap\.sh\s*$", dry.stdout, re.M), (target, dry.stdout)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^bash scripts/bootstrap\.sh$", ci, re.M)  # CI installs everything


@pytest.mark.slow
def test_the_demos_closing_lines_work_as_printed(tmp_path: Path) -> None:
    env = _bare_env()
    done = subprocess.run(
        [str(ORBIT), "demo", "--dir", "var/demo"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tail = done.stdout.split("Demo complete", 1)[1]
    assert "export ORBIT_VAR_DIR=var/demo" in tail and "What next:" in tail, tail
    commands = [
        ln.strip().split("  #")[0].strip() for ln in tail.splitlines() if ln.startswith("  orbit ")
    ]
    assert len(commands) >= 5, tail
    shown = _bare_env(ORBIT_VAR_DIR="var/demo")
    for command in commands:
        proc = subprocess.run(
            [str(ORBIT), *command.split()[1:]], cwd=tmp_path, env=shown, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, (command, proc.stderr)
        if command.startswith("orbit job list"):
            assert proc.stdout.count("SUCCEEDED") == 3, proc.stdout
        if command.startswith("orbit db current"):
            assert "var/demo/platform.sqlite3" in proc.stdout, proc.stdout
    # without ORBIT_VAR_DIR: the error names var/platform.sqlite3 and points at var/demo
    proc = subprocess.run(
        [str(ORBIT), "job", "list", "acme"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert_one_line_error(proc, 1, "ORBIT_VAR_DIR=var/demo", str(tmp_path / "var"))
    assert not (tmp_path / "var" / "platform.sqlite3").exists()


def _walkthrough_commands() -> list[list[str]]:
    """Every `orbit` line of README's walkthrough (``The archive cycle with the CLI alone`` up
    to the next ``##`` section), continuation lines joined, `VAR=value` prefixes dropped."""
    import shlex

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The archive cycle with the CLI alone", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split(" #", 1)[0].replace("&", " "))
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                words = words[1:]
            if words[:1] == ["orbit"]:
                out.append(words[1:])
    return out


def test_readme_walkthrough_commands_exist_with_their_options() -> None:
    """What README tells a new operator to type parses: the command and each option exist
    (resolved as click resolves them, in-process)."""
    import click
    from click.testing import CliRunner

    from orbit_tasks.cli.main import load_all_commands

    cli = load_all_commands()
    commands = _walkthrough_commands()
    assert ["worker", "control"] in commands and ["db", "upgrade"] in commands, commands
    for argv in commands:
        node: Any = cli
        depth = 0
        for word in (a for a in argv if not a.startswith("-") and not a.startswith("<")):
            sub = (
                node.get_command(click.Context(cli), word)
                if isinstance(node, click.Group)
                else None
            )
            if sub is None:
                break
            node, depth = sub, depth + 1
        assert depth and not isinstance(node, click.Group), f"unknown: orbit {' '.join(argv)}"
        words = [a for a in argv if not a.startswith("-") and not a.startswith("<")][:depth]
        shown = CliRunner().invoke(cli, [*words, "--help"])
        assert shown.exit_code == 0, shown.output
        for option in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert option in shown.output, f"orbit {' '.join(words)} has no {option}"
