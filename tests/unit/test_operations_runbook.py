"""docs/operations.md is the runbook the alerts link to (``docs/operations.md#<alert-lowercase>``):
every alert, every archive error code and wait reason and every sender REVIEW code has its
section, and every ``orbit`` command line it tells an operator to run exists with the options it
uses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from orbit_tasks.archive.controls import WaitReason
from orbit_tasks.archive.jobs import ErrorCode
from orbit_tasks.cli.main import load_all_commands
from orbit_tasks.sender.policy import RETRY_CODES, REVIEW_CODES

cli = load_all_commands()

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "docs" / "operations.md"
ALERTS = [
    "OrbitStorageUnserved",
    "OrbitArchiveLeasesExpired",
    "OrbitArchiveJobsFailed",
    "OrbitArchivePlansOverdue",
    "OrbitArchiveBacklogNotShrinking",
    "OrbitOutboxReviewRows",
    "OrbitOutboxRowsNearDeadline",
    "OrbitSourceDown",
    "OrbitBeatTicksStopped",
]


def _text() -> str:
    return RUNBOOK.read_text(encoding="utf-8")


def _anchors() -> set[str]:
    """GitHub's heading anchors: lowercase, spaces to '-', punctuation other than '-'/'_' gone."""
    out = set()
    for heading in re.findall(r"^#{2,4} (.+)$", _text(), re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


def _alert_names() -> list[str]:
    rules = REPO / "compose" / "prometheus" / "alerts.yml"
    names = re.findall(r"^\s*-?\s*alert:\s*(\w+)", rules.read_text(encoding="utf-8"), re.M)
    assert set(ALERTS) <= set(names), names
    return names


def test_every_alert_has_its_section() -> None:
    anchors = _anchors()
    for alert in _alert_names():
        assert alert.lower() in anchors, alert


def test_every_archive_error_code_has_its_section() -> None:
    anchors = _anchors()
    for code in ErrorCode:
        assert code.value.lower() in anchors, code


def test_every_archive_wait_reason_has_its_section() -> None:
    anchors = _anchors()
    assert "archive-wait-reasons" in anchors
    for reason in WaitReason:
        assert reason.value.lower() in anchors, reason


def test_every_sender_code_is_explained() -> None:
    text = _text()
    for code in REVIEW_CODES:
        assert re.search(rf"^\| `{code}` \|", text, re.M), code
    for code in RETRY_CODES:
        assert f"`{code}`" in text, code


def test_internal_links_resolve() -> None:
    anchors = _anchors()
    for target in re.findall(r"\]\(#([^)]+)\)", _text()):
        assert target in anchors, target
    for doc in re.findall(r"\]\(([\w\-]+\.md)\)", _text()):
        if doc != "metrics.md":  # written by the exporter's branch
            assert (RUNBOOK.parent / doc).is_file(), doc


def _orbit_lines() -> list[list[str]]:
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", _text(), re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            for part in re.split(r"\s*(?:;|&&|\$\(|\|)\s*", line):
                if part.startswith("orbit "):
                    lines.append(shlex.split(part.replace("[", "").replace("]", ""))[1:])
    for span in re.findall(r"`(orbit [^`]+)`", _text()):
        for part in re.split(r"\s*(?:;|&&|\|)\s*", span):
            if part.startswith("orbit ") and "..." not in part:
                lines.append(shlex.split(part.replace("[", "").replace("]", ""))[1:])
    return lines


@pytest.mark.parametrize("argv", _orbit_lines(), ids=lambda a: " ".join(a[:3]))
def test_runbook_commands_exist(argv: list[str]) -> None:
    path = [a for a in argv if not a.startswith("-") and not a.startswith("<")]
    node: Any = cli
    depth = 0
    ctx = click.Context(cli)
    for word in path:
        # get_command, as click resolves a word: lazy groups load their commands on first use
        sub = node.get_command(ctx, word) if isinstance(node, click.Group) else None
        if sub is None:
            break
        node, depth = sub, depth + 1
    assert depth > 0 and not isinstance(node, click.Group), f"unknown command: orbit {argv}"
    result = CliRunner().invoke(cli, [*path[:depth], "--help"])
    assert result.exit_code == 0, result.output
    for opt in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert opt in result.output, f"orbit {' '.join(path[:depth])} has no option {opt}"
