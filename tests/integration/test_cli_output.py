"""Output scripts can rely on (issue 9 item 6), through the real ``orbit`` script on the embedded
default (SQLite, filesystem broker): every list command's ``--json`` is
``{"items": [...], "next": cursor-or-null}``; ``job show`` prints text unless ``--json``;
``job watch --json`` prints one JSON object per change."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import ORBIT, REPO, invoke_json, orbit_env, run_orbit
from tests.support.db import migrated_engine


@dataclass
class CliScene:
    """A scene built through the ``orbit`` script itself (SQLite): its environment, the
    namespace and the ids of its jobs."""

    env: dict[str, str]
    ns: str
    jobs: list[str]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[CliScene]:
    """One namespace with a queue, a credential, a volume, two plans and their two PENDING jobs."""
    url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
    with migrated_engine(url, "platform"):
        env = orbit_env(url, ORBIT_VAR_DIR=str(tmp_path / "var"), ORBIT_ACTOR="tester")
        ns = invoke_json(["namespace", "create", "acme"], env)["id"]
        invoke_json(["queue", "create", "acme", "emails"], env)
        invoke_json(["credential", "create", "acme"], env)
        storage = invoke_json(["storage", "init", str(tmp_path / "vol")], env)["id"]
        for kind in ("tasks", "events"):
            invoke_json(["dev", "seed-history", "acme", "--kind", kind, "--roots", "20"], env)
            rev = invoke_json(["policy", "set", "acme", kind, "--archive-after", "1h"], env)
            invoke_json(
                [
                    *("plan", "set", "acme", kind, "--storage", storage, "--interval", "1d"),
                    *("--batch-size", "10", "--max-bytes", "8MiB", "--enable"),
                    *("--policy-revision", str(rev["revision"])),
                ],
                env,
            )
        tick = invoke_json(["archive", "tick"], env)
        jobs = [j["job_id"] for j in tick["jobs_created"]]
        assert len(jobs) == 2
        yield CliScene(env, ns, sorted(jobs))


def _json(args: list[str], env: dict[str, str]) -> Any:
    proc = run_orbit([*args, "--json"], env)
    assert proc.returncode == 0, (args, proc.stderr)
    return json.loads(proc.stdout)


LIST_COMMANDS = [
    ["namespace", "list"],
    ["storage", "list"],
    ["policy", "list", "acme"],
    ["plan", "list"],
    ["plan", "list", "acme"],
    ["job", "list", "acme"],
    ["queue", "list", "acme"],
    ["credential", "list", "acme"],
]


def test_every_list_command_prints_items_and_next(world: CliScene) -> None:
    for args in LIST_COMMANDS:
        doc = _json(args, world.env)
        assert isinstance(doc, dict) and sorted(doc) == ["items", "next"], (args, doc)
        assert doc["next"] is None, args
        assert doc["items"] and all(isinstance(i, dict) for i in doc["items"]), (args, doc)
    assert [j["id"] for j in _json(["job", "list", "acme"], world.env)["items"]] == world.jobs


def test_job_list_pages_with_the_cursor_in_next(world: CliScene) -> None:
    first = _json(["job", "list", "acme", "--limit", "1"], world.env)
    assert [j["id"] for j in first["items"]] == world.jobs[:1] and first["next"]
    second = _json(["job", "list", "acme", "--limit", "1", "--after", first["next"]], world.env)
    assert [j["id"] for j in second["items"]] == world.jobs[1:] and second["next"] is None
    human = run_orbit(["job", "list", "acme", "--limit", "1"], world.env)
    assert human.returncode == 0 and f"--after {first['next']}" in human.stdout


def test_job_show_prints_text_unless_json(world: CliScene) -> None:
    job = world.jobs[0]
    text = run_orbit(["job", "show", "acme", job], world.env)
    assert text.returncode == 0, text.stderr
    with pytest.raises(ValueError):
        json.loads(text.stdout)
    lines = dict(line.split(None, 1) for line in text.stdout.strip().splitlines())
    assert lines["job"] == job and lines["state"] == "PENDING" and lines["roots"] == "0"
    assert lines["namespace_id"] == world.ns and ".." in lines["range"]
    shown = _json(["job", "show", "acme", job], world.env)
    assert shown["id"] == job and shown["state"] == "PENDING" and shown["range"]["until"]


def test_job_watch_json_prints_one_object_per_change(world: CliScene) -> None:
    job = world.jobs[0]
    watch = subprocess.Popen(
        [str(ORBIT), "job", "watch", "acme", job, "--json", "--interval", "1s"],
        env=world.env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())  # the current state, at once
        assert first["id"] == job and first["state"] == "PENDING" and first["total_roots"] > 0
        time.sleep(1)  # several polls without a change: no further line
        abandoned = run_orbit(["job", "abandon", "acme", job], world.env)
        assert abandoned.returncode == 0, abandoned.stderr
        rest, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 1, err  # ABANDONED ends the watch with exit 1
    objects = [json.loads(line) for line in rest.splitlines()]
    assert [o["state"] for o in objects] == ["ABANDONED"]
    assert objects[0]["revision"] == first["revision"] + 1
    assert objects[0]["total_roots"] == first["total_roots"]
