"""compose/ cannot be started here (no Docker engine), so keep it honest: every ``orbit``
command line it runs must exist in the CLI with the options it passes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from orbit_tasks.cli.main import cli

COMPOSE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def _orbit_services(text: str) -> dict[str, str]:
    """Service name -> its YAML block, for services built from the orbit image."""
    blocks = re.split(r"^  ([a-z0-9-]+):\n", text.split("\nservices:\n", 1)[1], flags=re.M)
    named = dict(zip(blocks[1::2], blocks[2::2], strict=True))
    return {name: block for name, block in named.items() if "<<: *orbit" in block}


def _compose_commands() -> list[list[str]]:
    text = COMPOSE.read_text(encoding="utf-8")
    commands = []
    for block in _orbit_services(text).values():
        if "entrypoint:" not in block:  # the image's entrypoint is `orbit`
            commands += [json.loads(m) for m in re.findall(r"^\s+command: (\[.+\])", block, re.M)]
    # The one-shot migrate service runs a shell line of `orbit ...` commands joined by &&.
    shell = re.search(r"^\s+- >-\n((?:\s{8,}.+\n)+)", text, re.M)
    if shell:
        line = " ".join(shell.group(1).split())
        commands += [part.split()[1:] for part in line.split("&&")]
    return [c for c in commands if c]


def test_compose_runs_known_commands() -> None:
    commands = _compose_commands()
    assert len(commands) >= 8  # api, beat, 3 workers, 3 migrate steps
    runner = CliRunner()
    for argv in commands:
        path = [a for a in argv if not a.startswith("-")]
        # Resolve the command path (group names), then ask that command for --help.
        ctx_cmd = cli
        depth = 0
        for word in path:
            sub = getattr(ctx_cmd, "commands", {}).get(word)
            if sub is None:
                break
            ctx_cmd, depth = sub, depth + 1
        assert depth > 0, f"compose runs unknown command: orbit {' '.join(argv)}"
        result = runner.invoke(cli, [*path[:depth], "--help"])
        assert result.exit_code == 0, argv
        for opt in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert opt in result.output, f"orbit {' '.join(path[:depth])} has no option {opt}"


@pytest.mark.parametrize("service", ["api", "beat", "worker-control", "worker-archive-a"])
def test_every_service_is_declared(service: str) -> None:
    assert re.search(rf"^  {re.escape(service)}:$", COMPOSE.read_text(), re.M)
