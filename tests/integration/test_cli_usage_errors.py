"""Bad option values, missing options and arguments, unknown commands (issue 14 item 6.4): click's
usage errors go through the CLI's one error boundary like every other refusal (docs/cli.md):
exit 2, one ``error:`` line naming the option, the value and, for ranges and choices, what is
allowed; no usage block, no traceback, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, invoke_orbit, orbit_env, run_orbit

J = "0" * 32  # a well-formed job id: the option is refused before anything looks it up

# (arguments, needles of the one line): every click option with a type, range, choice or path
# of orbit_tasks/cli/, each given a bad value, plus missing options and arguments.
BAD = [
    (["api", "serve", "--port", "0"], ["'--port'", "0", "allowed 1..65535"]),
    (["api", "serve", "--log-level", "loud"], ["'--log-level'", "'loud'", "'info'"]),
    (["demo", "--dir", "{file}"], ["'--dir'", "{file}", "is a file"]),
    (["dev", "seed-history", "acme", "--kind", "tasks", "--roots", "many"],
     ["'--roots'", "'many'"]),
    (["dev", "seed-history", "acme", "--kind", "tasks"], ["'--roots'", "missing"]),
    (["dev", "seed-history", "acme", "--roots", "5"], ["'--kind'", "missing"]),
    (["dev", "seed-history", "acme", "--kind", "tasks", "--roots", "5", "--children", "x"],
     ["'--children'", "'x'"]),
    (["dev", "seed-history", "acme", "--kind", "tasks", "--roots", "5", "--days", "1.5"],
     ["'--days'", "'1.5'"]),
    (["dev", "seed-history", "acme", "--kind", "tasks", "--roots", "5", "--settled-fraction",
      "most"], ["'--settled-fraction'", "'most'"]),
    (["dev", "seed-history", "acme", "--kind", "tasks", "--roots", "5", "--seed", "s"],
     ["'--seed'", "'s'"]),
    (["flower", "--port", "0"], ["'--port'", "0", "allowed 1..65535"]),
    (["flower", "--max-tasks", "10"], ["'--max-tasks'", "10", "allowed 1,000..10,000,000"]),
    (["flower", "--purge-offline-workers", "5"],
     ["'--purge-offline-workers'", "'5'", "needs a unit"]),
    (["flower", "--purge-offline-workers", "30s"],
     ["'--purge-offline-workers'", "30s", "allowed 1m..30d"]),
    (["metrics", "serve", "--port", "70000"], ["'--port'", "70000", "allowed 1..65535"]),
    (["job", "list", "acme", "--state", "DONE"], ["'--state'", "'DONE'", "'SUCCEEDED'"]),
    (["job", "list", "acme", "--limit", "0"], ["'--limit'", "0", "allowed 1..1000"]),
    (["job", "list", "acme", "--limit", "1001"], ["'--limit'", "1001", "allowed 1..1000"]),
    (["job", "list"], ["'NS'", "missing"]),
    (["job", "watch", "acme", J, "--interval", "0"], ["'--interval'", "'0'", "needs a unit"]),
    (["job", "watch", "acme", J, "--interval", "0s"], ["'--interval'", "0s", "allowed 1s..1m"]),
    (["job", "watch", "acme", J, "--timeout", "-1s"], ["'--timeout'", "'-1s'", "not a duration"]),
    (["job", "retry", "acme", J, "--max-bytes", "12XB"], ["--max-bytes", "12XB"]),
    (["job", "retry", "acme", J, "--expect-revision", "two"], ["'--expect-revision'", "'two'"]),
    (["job", "abandon", "acme", J, "--expect-revision", "two"], ["'--expect-revision'", "'two'"]),
    (["job", "verify", "acme", J], ["'--volume'", "missing"]),
    (["job", "export", "acme", J], ["'--volume'", "missing"]),
    (["job", "restore", "acme", J, "--into", "sqlite:///t.sqlite3"], ["'--volume'", "missing"]),
    (["job", "restore", "acme", J, "--volume", "v"], ["'--into'", "missing"]),
    (["plan", "set", "acme", "tasks", "--interval", "5q"], ["--interval", "5q"]),
    (["plan", "set", "acme", "tasks", "--batch-size", "ten"], ["'--batch-size'", "'ten'"]),
    (["plan", "set", "acme", "tasks", "--max-bytes", "1ZB"], ["--max-bytes", "1ZB"]),
    (["plan", "set", "acme", "tasks", "--policy-revision", "r1"], ["'--policy-revision'", "'r1'"]),
    (["plan", "set", "acme", "tasks", "--expect-revision", "r1"], ["'--expect-revision'", "'r1'"]),
    (["policy", "set", "acme", "tasks", "--archive-after", "3w"], ["--archive-after", "3w"]),
    (["policy", "set", "acme", "tasks"], ["'--archive-after'", "missing"]),
    (["archive", "restore", "acme", "tasks", "--volume", "v", "--into", "sqlite:///t.sqlite3",
      "--from", "yesterday"], ["'--from'", "'yesterday'", "YYYY-MM-DD"]),
    (["archive", "restore", "acme", "tasks", "--volume", "v", "--into", "sqlite:///t.sqlite3",
      "--until", "2026-02-30"], ["'--until'", "'2026-02-30'", "YYYY-MM-DD"]),
    (["archive", "restore", "acme", "tasks", "--into", "sqlite:///t.sqlite3"],
     ["'--volume'", "missing"]),
    (["sender", "list", "--state", "LOST"], ["'--state'", "'LOST'", "'ACCEPTED'"]),
    (["sender", "list", "--limit", "0"], ["'--limit'", "0", "allowed 1..1000"]),
    (["storage", "init"], ["'PATH'", "missing"]),
    (["worker", "archive"], ["'--volume'", "missing"]),
    (["worker", "archive", "--volume", "v", "-c", "0"], ["'--concurrency'", "0", "allowed 1..256"]),
    (["worker", "control", "--pool", "gevent"], ["'--pool'", "'gevent'", "'prefork'"]),
    (["worker", "sender", "--concurrency", "300"], ["'--concurrency'", "300", "allowed 1..256"]),
    (["nosuch"], ["'nosuch'", "no such command"]),
    (["--bogus"], ["'--bogus'", "no such option"]),
    (["job", "list", "acme", "--bogus"], ["'--bogus'", "no such option"]),
]  # fmt: skip


def _filled(values: list[str], file: Path) -> list[str]:
    return [v.replace("{file}", str(file)) for v in values]


@pytest.mark.parametrize("args,needles", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_click_usage_errors_are_one_line(
    args: list[str], needles: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain-file"
    plain.write_text("not a directory")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = orbit_env(f"sqlite:///{work / 'platform.sqlite3'}", ORBIT_VAR_DIR=str(work / "var"))
    result = invoke_orbit(_filled(args, plain), env)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Usage:" not in result.stderr and "Traceback" not in result.stderr
    for needle in _filled(needles, plain):
        assert needle.lower() in lines[0].lower(), (needle, lines[0])
    assert result.stdout == ""
    assert os.listdir(work) == []  # no database file, no var/ folder


def test_the_real_script_prints_one_line_for_a_bad_option(tmp_path: Path) -> None:
    env = orbit_env(f"sqlite:///{tmp_path / 'platform.sqlite3'}", ORBIT_VAR_DIR=str(tmp_path))
    proc = run_orbit(["archive", "restore", "acme", "tasks", "--volume", "v", "--into",
                      "sqlite:///t.sqlite3", "--from", "yesterday"], env, cwd=tmp_path)  # fmt: skip
    assert_one_line_error(proc, 2, "'--from'", "'yesterday'", "YYYY-MM-DD")
    assert os.listdir(tmp_path) == []


def test_help_is_still_help(tmp_path: Path) -> None:
    env = orbit_env(f"sqlite:///{tmp_path / 'platform.sqlite3'}")
    shown = invoke_orbit(["job", "list", "--help"], env)
    assert shown.exit_code == 0 and "Usage:" in shown.stdout
    bare = invoke_orbit(["job"], env)  # a group without its command prints its help
    assert "Usage:" in bare.stdout + bare.stderr and "error:" not in bare.stderr
