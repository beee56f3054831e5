"""The operator's one line per exception (cli/errors.py) and the database URL checks
(db/engine.py): pure functions, exercised with the exceptions the drivers raise."""

from __future__ import annotations

import errno
import sqlite3

import pytest
from sqlalchemy.exc import OperationalError, ProgrammingError

from orbit_tasks.archive.plans import validate_batch_size
from orbit_tasks.db.engine import SETTING_ATTR, parse_database_url
from orbit_tasks.error_lines import describe_error, missing_table
from orbit_tasks.errors import InvalidInput, NotFound
from orbit_tasks.redaction import redact_url


class FakeMySQLError(Exception):
    """Stands in for MySQLdb's exceptions: ``args == (code, message)``."""


def _programming(code: int, message: str) -> ProgrammingError:
    return ProgrammingError(
        "SELECT secret FROM t WHERE x = %s", ("p@ss",), FakeMySQLError(code, message)
    )


def test_project_errors_keep_their_exit_code() -> None:
    assert describe_error(InvalidInput("--x 5 out of range (allowed 1..4)")) == (
        "--x 5 out of range (allowed 1..4)",
        2,
    )
    assert describe_error(NotFound("namespace 'x' does not exist"))[1] == 4


def test_missing_tables_name_their_database_and_never_the_statement() -> None:
    mysql = _programming(1146, "Table 'orbit_t_1.orbit_archive_jobs' doesn't exist")
    assert missing_table(mysql) == "orbit_archive_jobs"
    line, code = describe_error(mysql)
    assert code == 1 and "`orbit db upgrade`" in line and "SELECT" not in line
    lite = OperationalError(
        "SELECT 1", (), sqlite3.OperationalError("no such table: sender_outbox")
    )
    assert missing_table(lite) == "sender_outbox"
    assert "`orbit sender db upgrade`" in describe_error(lite)[0]
    other = _programming(1064, "You have an error in your SQL syntax near 'p@ss'")
    line, _ = describe_error(other)
    assert line == "database refused the change (FakeMySQLError, driver code 1064)"


def test_the_failing_database_is_named_when_known() -> None:
    exc = OperationalError("x", (), FakeMySQLError(2003, "Can't connect"))
    setattr(exc, SETTING_ATTR, "ORBIT_DATABASE_URL 'mysql://u:***@h/db'")
    assert describe_error(exc) == (
        "database unavailable (driver code 2003) [ORBIT_DATABASE_URL 'mysql://u:***@h/db']",
        1,
    )


def test_os_import_and_unexpected_errors() -> None:
    ro = OSError(errno.EROFS, "Read-only file system", "/mnt/vol")
    assert describe_error(ro) == ("/mnt/vol: read-only file system (EROFS)", 1)
    link = OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b")
    assert describe_error(link)[0] == "/a -> /b: invalid cross-device link (EXDEV)"
    missing = ModuleNotFoundError("No module named 'MySQLdb'", name="MySQLdb")
    assert describe_error(missing)[0].startswith("the module 'MySQLdb' cannot be loaded")
    line, code = describe_error(KeyError("token-abc"))
    assert code == 1 and "KeyError" in line and "token-abc" not in line


@pytest.mark.parametrize(
    "url,shown",
    [
        ("mysql://root:pw@h:3306/db", "mysql://***@h:3306/db"),
        ("mysql://root@h/db", "mysql://***@h/db"),  # issue 26: the strictest redactor
        ("user:p@ss@host/db", "***@host/db"),
        ("sqlite:///var/x.sqlite3", "sqlite:///var/x.sqlite3"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_parse_database_url_accepts_the_supported_ones() -> None:
    assert parse_database_url("mysql://root@127.0.0.1:3306/orbit").database == "orbit"
    assert parse_database_url("mariadb://root@h/orbit").get_backend_name() == "mariadb"
    assert parse_database_url("mysql+mysqldb://root@h:1/orbit").port == 1
    assert parse_database_url("sqlite:///var/p.sqlite3").database == "var/p.sqlite3"
    assert parse_database_url("sqlite+pysqlite://").database is None


@pytest.mark.parametrize(
    "url,needle",
    [
        ("oracle://h/db", "'oracle'"),
        ("mysql://h:0/db", "port 0"),
        ("mysql://h:65536/db", "port 65536"),
        ("mysql://h:x1/db", "port 'x1'"),
        ("mysql://h", "no database"),
        ("orbit.sqlite3", "no scheme"),
    ],
)
def test_parse_database_url_refusals_name_the_variable(url: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match="ORBIT_X") as err:
        parse_database_url(url, "ORBIT_X")
    assert needle in str(err.value)


def test_stores_name_fields_and_the_cli_words_them_as_flags() -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_batch_size(0)
    assert str(caught.value) == "batch_size 0 is out of range (allowed 1..100)"
    assert describe_error(caught.value) == ("--batch-size 0 is out of range (allowed 1..100)", 2)
    needs = InvalidInput(
        "a new plan needs {storage_id}, {interval_seconds}",
        fields=("storage_id", "interval_seconds"),
    )
    assert str(needs) == "a new plan needs storage_id, interval_seconds"
    assert describe_error(needs)[0] == "a new plan needs --storage, --interval"
    braces = InvalidInput("{max_bytes} {'a': 1} is not an integer", fields=("max_bytes",))
    assert describe_error(braces)[0] == "--max-bytes {'a': 1} is not an integer"


def test_archive_rules_name_fields_that_the_cli_words_as_their_flags() -> None:
    import datetime as dt

    from orbit_tasks.archive import controls
    from orbit_tasks.archive.restore.run import Window

    with pytest.raises(InvalidInput) as rate:
        controls.validate_rate("2.5")
    assert str(rate.value).startswith("max_roots_per_second '2.5' is not an integer")
    assert describe_error(rate.value)[0] == (
        "--max-roots-per-second '2.5' is not an integer (allowed an integer 1..10,000,000)"
    )
    with pytest.raises(InvalidInput) as reason:
        controls.validate_reason(" ")
    # issue 27: the message names the actual problem ("--reason of 1 characters is invalid" did not)
    assert describe_error(reason.value)[0].startswith("--reason is blank (allowed 1..255")
    with pytest.raises(InvalidInput) as window:
        Window(dt.datetime(2026, 3, 2), dt.datetime(2026, 3, 1))
    plain, worded = str(window.value), describe_error(window.value)[0]
    assert plain.startswith("from_ 2026-03-02") and " must be before until 2026-03-01" in plain
    assert worded.startswith("--from 2026-03-02") and " must be before --until 2026-03-01" in worded
