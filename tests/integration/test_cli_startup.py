"""Each command loads what it uses and no more (issue 19's start-up item): measured with
``python -X importtime``, alembic and the migration chain cost every ``orbit sender`` command
0.33 s and the ORM 0.17 s before they were loaded on first use (cli/sender.py, sender/outbox.py).
A fresh interpreter per case: ``sys.modules`` after resolving the command (``--help`` stops it
before any database is opened)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.cli import REPO

HEAVY = (
    "alembic",
    "sqlalchemy.orm",
    "orbit_tasks.db.migrate",
    "boto3",
    "orbit_tasks.archive.restore",
)

PROBE = """
import sys
from orbit_tasks.cli.main import main
sys.argv = ["orbit", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print("LOADED=" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def _loaded(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("LOADED=")]
    assert line, (done.stdout, done.stderr)
    return {m for m in line[-1].removeprefix("LOADED=").split(",") if m}


@pytest.mark.parametrize(
    "args",
    [
        ("sender", "list", "--help"),
        ("sender", "requeue", "--help"),
        ("archive", "tick", "--help"),
        ("job", "show", "--help"),
    ],
)
def test_a_command_loads_neither_the_migrations_nor_the_orm_nor_s3(args: tuple[str, ...]) -> None:
    assert _loaded(*args) == set()


def test_the_migration_commands_still_load_them() -> None:
    assert "orbit_tasks.db.migrate" in _loaded("sender", "db", "current", "--help")


def test_restore_loads_the_restore_engine() -> None:
    assert "orbit_tasks.archive.restore" in _loaded("archive", "restore", "--help")
