"""compose/ cannot be started here (no Docker engine), so keep it honest: every ``orbit``
command line it runs must exist in the CLI with the options it passes, and the deployment has
the shape docs/operations.md describes (one beat, one archive worker per volume consuming only its
queue, Flower with auth from the env file, MySQL 8.0 by default and MariaDB as a profile)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from orbit_tasks.cli.main import load_all_commands

cli = load_all_commands()

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yml"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
MIGRATE = COMPOSE_DIR / "migrate.sh"


def _services() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"])


def _orbit_services() -> dict[str, dict[str, Any]]:
    """Services built from the orbit image (whose entrypoint is ``orbit``)."""
    return {n: s for n, s in _services().items() if s.get("image") == "orbit-tasks:dev"}


def _compose_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after ``orbit``) for every orbit command line compose runs."""
    commands = []
    for name, service in _orbit_services().items():
        if "entrypoint" not in service:  # the image's entrypoint is `orbit`
            commands.append((name, [str(a) for a in service["command"]]))
    # The migrate one-shot runs compose/migrate.sh: its `orbit ...` lines.
    for line in MIGRATE.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("orbit "):
            argv = re.split(r"\|\||&&|;", line.strip())[0].split()[1:]
            commands.append(("migrate.sh", argv))
    return commands


def _params() -> list[Any]:
    out = []
    for where, argv in _compose_commands():
        out.append(pytest.param(argv, id=f"{where}:{' '.join(argv[:2])}"))
    return out


def test_compose_runs_enough_commands() -> None:
    commands = _compose_commands()
    # api, beat, control, 2 archive workers, sender, flower, metrics + 4 migrate steps
    assert len(commands) == 14, commands  # + the S3 example's worker (issue 18), a second beat
    assert ("migrate.sh", ["db", "upgrade"]) in commands
    assert ("migrate.sh", ["sender", "db", "upgrade"]) in commands


@pytest.mark.parametrize("argv", _params())
def test_compose_command_exists_with_its_options(argv: list[str]) -> None:
    path = [a for a in argv if not a.startswith("-")]
    ctx_cmd: Any = cli
    depth = 0
    for word in path:
        # click's own lookup: a lazily loaded subgroup (``sender db``) is in ``.commands`` only
        # once another test has loaded it (the order differs under xdist)
        is_group = isinstance(ctx_cmd, click.Group)
        sub = ctx_cmd.get_command(click.Context(ctx_cmd), word) if is_group else None
        if sub is None:
            break
        ctx_cmd, depth = sub, depth + 1
    assert depth > 0, f"compose runs unknown command: orbit {' '.join(argv)}"
    assert not isinstance(ctx_cmd, click.Group), f"orbit {' '.join(path[:depth])} is a group"
    result = CliRunner().invoke(cli, [*path[:depth], "--help"])
    assert result.exit_code == 0, (argv, result.output)
    for opt in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert opt in result.output, f"orbit {' '.join(path[:depth])} has no option {opt}"


def test_databases_mysql8_default_and_mariadb_profile() -> None:
    services = _services()
    mysql, mariadb = services["mysql"], services["mariadb"]
    assert mysql["image"].startswith("mysql:8.0")
    assert mariadb["image"].startswith("mariadb:10.11")
    assert mysql["profiles"] == ["mysql"] and mariadb["profiles"] == ["mariadb"]
    env = ENV_EXAMPLE.read_text(encoding="utf-8")
    assert re.search(r"^COMPOSE_PROFILES=mysql$", env, re.M)  # MySQL 8.0 is the default
    for db in (mysql, mariadb):
        assert db["networks"]["default"]["aliases"] == ["db"]  # orbit talks to `db` either way
        assert "./db-init:/docker-entrypoint-initdb.d:ro" in db["volumes"]
    for name, service in _orbit_services().items():
        url = service["environment"]["ORBIT_DATABASE_URL"]
        assert "@db:3306/orbit" in url, name


def test_redis_persists_and_two_beats_run_one_leading() -> None:
    """Two beats on hosts of their own (issue 30 item 3: the database lease picks the leader)."""
    services = _services()
    assert "--appendonly" in services["redis"]["command"]
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    beats = [n for n, s in _orbit_services().items() if s.get("command", [None])[:1] == ["beat"]]
    assert beats == ["beat", "beat-standby"]
    assert services["beat"]["hostname"] != services["beat-standby"]["hostname"]
    for name in beats:
        assert "deploy" not in services[name] and "scale" not in services[name]


def test_each_archive_worker_mounts_one_volume_and_consumes_only_its_queue() -> None:
    workers = {
        n: s
        for n, s in _orbit_services().items()
        if s.get("command", [])[:2] == ["worker", "archive"]
    }
    assert sorted(workers) == ["worker-archive-a", "worker-archive-b", "worker-archive-s3"]
    mounted = set()
    for name, service in workers.items():
        argv = service["command"]
        assert "--no-control" in argv, name
        volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
        assert len(volumes) == 1, name
        if volumes[0].startswith("s3://"):  # an S3 storage mounts no archive: credentials only
            assert all(v.startswith("counters:") for v in service.get("volumes", [])), name
            assert "AWS_ACCESS_KEY_ID" in service["environment"]
            continue
        mounts = [v for v in service["volumes"] if v.split(":")[1] == volumes[0]]
        # its volume, plus the counters volume every worker shares with the exporter
        others = [v for v in service["volumes"] if v not in mounts]
        assert len(mounts) == 1 and others == ["counters:/app/var/counters"], name
        mounted.add(mounts[0].split(":")[0])
    assert mounted == {"archive-a", "archive-b"}
    migrate = _services()["migrate"]
    for volume in ("archive-a", "archive-b"):
        assert any(v.startswith(f"{volume}:") for v in migrate["volumes"])


def test_flower_has_auth_from_the_env_file_and_secrets_stay_scoped() -> None:
    services = _orbit_services()
    flower = services["flower"]
    assert flower["command"][:1] == ["flower"]
    assert "ORBIT_FLOWER_BASIC_AUTH" in flower["environment"]
    assert all(p.startswith("127.0.0.1:") for p in flower["ports"])
    env = ENV_EXAMPLE.read_text(encoding="utf-8")
    assert re.search(r"^ORBIT_FLOWER_BASIC_AUTH=\w+:\S{8,}$", env, re.M)
    for name, service in services.items():
        if name != "flower":
            assert "ORBIT_FLOWER_BASIC_AUTH" not in service["environment"], name
        if name != "worker-sender":
            assert "ORBIT_API_TOKEN" not in service["environment"], name


def test_metrics_and_prometheus() -> None:
    services = _services()
    assert services["metrics"]["command"] == [
        "metrics", "serve", "--host", "0.0.0.0", "--port", "10108",
    ]  # fmt: skip
    # The workers' counters: every worker writes them where the exporter sums them.
    env = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["x-orbit-env"]
    directory = env["PROMETHEUS_MULTIPROC_DIR"]
    for name, service in _orbit_services().items():
        if name == "metrics" or (service.get("command") or [""])[0] == "worker":
            assert f"counters:{directory}" in service["volumes"], name
    prom = services["prometheus"]
    assert prom["image"].startswith("prom/prometheus")
    assert "./prometheus:/etc/prometheus:ro" in prom["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]


def test_env_example_sets_every_required_variable() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert {"ORBIT_DB_PASSWORD", "DB_ROOT_PASSWORD", "ORBIT_FLOWER_BASIC_AUTH"} <= required
    env = ENV_EXAMPLE.read_text(encoding="utf-8")
    for name in required:
        assert re.search(rf"^{name}=\S+$", env, re.M), name


def test_docker_compose_config_accepts_the_file() -> None:
    assert shutil.which("docker-compose"), "docker-compose missing: `make install` installs it"
    for profile in ("mysql", "mariadb"):
        done = subprocess.run(
            ["docker-compose", "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE), "config", "-q"],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "COMPOSE_PROFILES": profile},
            check=False,
        )
        assert done.returncode == 0, done.stderr
