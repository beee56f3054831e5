"""Running the ``orbit`` CLI from tests, against the test databases.

``run_orbit`` starts the real console script (``.venv/bin/orbit``) as a subprocess;
``invoke_orbit`` runs the same click group in-process (faster; settings cache and engines are
reset around the call so that ``env`` is what the command sees). Both take the environment built
by ``orbit_env``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / ".venv" / "bin" / "orbit"


def orbit_env(platform_url: str, business_url: str | None = None, **extra: Any) -> dict[str, str]:
    """The process environment with every ``ORBIT_*`` variable replaced: the platform (and
    business) database URLs plus ``extra`` (e.g. ``ORBIT_ACTOR="alice"``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["ORBIT_DATABASE_URL"] = platform_url
    if business_url is not None:
        env["ORBIT_SENDER_DATABASE_URL"] = business_url
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_orbit(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    input: str | None = None,
    timeout: float = 120,
    cwd: Path | str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``.venv/bin/orbit ARGS`` and capture stdout/stderr as text (no exception on exit)."""
    return subprocess.run(
        [str(ORBIT), *args],
        env=dict(env),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd or REPO),
        check=False,
    )


def _reset_process_state() -> None:
    from orbit_tasks.db import registry
    from orbit_tasks.settings import get_settings

    get_settings.cache_clear()
    with registry._lock:
        engines = list(registry._engines.values())
        registry._engines.clear()
    for engine in engines:
        engine.dispose()


def invoke_orbit(args: Sequence[str], env: Mapping[str, str]) -> Result:
    """Run the ``orbit`` click group in-process with ``env`` as the environment.

    ``result.exit_code``, ``result.stdout`` and ``result.stderr`` as from the real script.
    """
    from orbit_tasks.cli.main import cli

    overrides: dict[str, str | None] = {k: None for k in os.environ if k.startswith("ORBIT_")}
    overrides.update(env)
    _reset_process_state()
    try:
        return CliRunner().invoke(cli, list(args), env=overrides, catch_exceptions=False)
    finally:
        _reset_process_state()


def invoke_json(args: Sequence[str], env: Mapping[str, str]) -> Any:
    """``invoke_orbit`` with ``--json`` appended; asserts exit 0 and returns the parsed output."""
    result = invoke_orbit([*args, "--json"], env)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def invoke_items(args: Sequence[str], env: Mapping[str, str]) -> list[Any]:
    """A list command with ``--json``: asserts the one list shape ``{"items": [...], "next": ...}``
    (docs/cli.md) and returns the items."""
    doc = invoke_json(args, env)
    assert isinstance(doc, dict) and sorted(doc) == ["items", "next"], doc
    return list(doc["items"])


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Exit ``code``, nothing on stdout, exactly one ``error: ...`` line on stderr, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout == ""
    return lines[0]
