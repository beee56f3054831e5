"""``orbit flower`` for real (SPEC §12 "Flower"): a Flower process on the test Redis, a real
pinned archive worker (``orbit worker archive --volume ... --no-control``), real HTTP with and
without basic auth, Flower's API and its workers page rendered by headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from orbit_tasks.archive.jobs import JobState
from orbit_tasks.archive.tick import run_tick
from tests.support.api_server import free_port
from tests.support.archive_jobs import (
    ArchiveEnv,
    archive_env,
    wait_for,
)
from tests.support.processes import ORBIT, Proc, started
from tests.support.scene import archive_scene

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
USER, PASSWORD = "ops", "flower-test-p@ss:w0rd"
AUTH = f"{USER}:{PASSWORD}"


def flower_env(ae: ArchiveEnv, **extra: str) -> dict[str, str]:
    env = dict(ae.env)
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    env.update(extra)
    return env


@contextmanager
def running_flower(
    ae: ArchiveEnv, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[Proc, str]]:
    port = free_port()
    cmd = [ORBIT, "flower", "--port", str(port), *args]
    with started(cmd, env or flower_env(ae), ae.tmp / f"flower-{port}.log") as proc:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert proc.proc.poll() is None, proc.text()
            with suppress(httpx.TransportError):
                return httpx.get(base + "/healthcheck", timeout=2).status_code == 200
            return False

        wait_for(healthy, 60, "flower /healthcheck")
        yield proc, base


def poll(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_for(fn, timeout, what, step=0.5)


def test_flower_with_auth_shows_the_pinned_worker_and_labelled_archive_tasks(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        ns, queue, vol, sid = archive_scene(
            platform_engine,
            name="flower-ns",
            volume=tmp_path / "vol",
            kind="events",
            roots=12,
            batch_size=5,
            label="flower-vol",
        ).parts
        storage_queue = f"orbit.archive.{sid.hex()}"
        node = f"flowerpin-{os.getpid()}@test"
        env = flower_env(ae, ORBIT_FLOWER_BASIC_AUTH=AUTH)
        # Flower first: it must see the worker come online (events are not replayed).
        with running_flower(ae, env=env) as (flower, base):
            worker_cmd = [ORBIT, "worker", "archive", "--volume", str(vol), "--no-control"]
            worker_cmd += ["-c", "1", "-n", node, "--", "--without-mingle", "--without-gossip"]
            with started(worker_cmd, ae.env, tmp_path / "worker.log") as worker:
                wait_for(lambda: "ready." in worker.text(), 60, "worker ready")
                with httpx.Client(base_url=base, timeout=30) as anon:
                    assert anon.get("/workers").status_code == 401
                    assert anon.get("/api/workers").status_code == 401
                    assert anon.get("/api/tasks").status_code == 401
                    wrong = anon.get("/api/workers", auth=(USER, "not-the-password"))
                    assert wrong.status_code == 401
                client = httpx.Client(base_url=base, timeout=30, auth=(USER, PASSWORD))
                with client:
                    assert client.get("/workers").status_code == 200

                    def pinned_worker() -> Any:
                        workers = client.get("/api/workers", params={"refresh": "1"}).json()
                        info = workers.get(node) or {}
                        return info if info.get("active_queues") else None

                    info = poll(pinned_worker, 60, "the pinned worker in /api/workers")
                    assert [q["name"] for q in info["active_queues"]] == [storage_queue]

                    # A job of kind events on that storage, woken with its label.
                    report = run_tick(platform_engine, ae.settings, lambda *a, **k: None)
                    ((_, kind, job_hex),) = report.jobs_created
                    job_id = bytes.fromhex(job_hex)
                    ae.publish(sid, ns, job_id, kind=kind)

                    def succeeded() -> bool:
                        return ae.job(ns, job_id).state is JobState.SUCCEEDED

                    poll(succeeded, 90, "the archive job SUCCEEDED")

                    def archive_tasks() -> list[dict[str, Any]]:
                        tasks = client.get(
                            "/api/tasks", params={"taskname": "orbit.archive.run_job"}
                        ).json()
                        return [t for t in tasks.values() if t.get("worker") == node]

                    tasks = poll(archive_tasks, 60, "the archive task in /api/tasks")
                    labels = {t["args"] for t in tasks}
                    expected = (
                        f"(kind=events, namespace={ns.hex()}, storage={sid.hex()}, job={job_hex})"
                    )
                    assert expected in labels, labels
                    # The tasks page shows the label column.
                    page = client.get("/tasks").text
                    assert ">args<" in page

                    dom = chromium_dump(f"http://{USER}:{_quote(PASSWORD)}@{base[7:]}/workers")
                    assert node in dom, dom[-2000:]
                    assert "Access denied" not in dom
            assert PASSWORD not in flower.text() and _quote(PASSWORD) not in flower.text()
            assert "flower.started" in flower.text()


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def chromium_dump(url: str) -> str:
    """The rendered DOM of ``url`` from headless Chromium (basic auth from the URL)."""
    assert Path(CHROMIUM).exists(), "chromium is not installed (.ci/run installs it)"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="orbit-chromium-") as profile:
        args = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ]
        done = subprocess.run(args, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode("utf-8", errors="replace")


def test_flower_refuses_to_start_without_auth(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "FLOWER_"))}
    env["ORBIT_VAR_DIR"] = str(tmp_path / "var")
    for args in (
        [],
        ["--address", "0.0.0.0"],
        ["--no-auth", "--address", "0.0.0.0"],
        ["--no-auth", "--address", "10.0.0.1"],
    ):
        done = subprocess.run(
            [ORBIT, "flower", "--port", str(free_port()), *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
        assert "ORBIT_FLOWER_BASIC_AUTH" in done.stderr or "--no-auth is refused" in done.stderr
    bad = dict(env, ORBIT_FLOWER_BASIC_AUTH="ops:tiny")
    done = subprocess.run(
        [ORBIT, "flower"], env=bad, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "tiny" not in done.stderr and "entry 1" in done.stderr


def test_flower_no_auth_is_allowed_on_loopback(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path
) -> None:
    with archive_env(mariadb_url, platform_engine, tmp_path) as ae:
        env = flower_env(ae, FLOWER_UNAUTHENTICATED_API="true")
        with running_flower(ae, "--no-auth", "--address", "127.0.0.1", env=env) as (proc, base):
            with httpx.Client(base_url=base, timeout=30) as anon:
                assert anon.get("/workers").status_code == 200
                # Pages only: the API stays closed even with FLOWER_UNAUTHENTICATED_API set.
                api = anon.get("/api/workers")
                assert api.status_code == 401
                assert "access-control-allow-origin" not in api.headers
                # Flower's own metrics answer without auth (documented: loopback or a proxy).
                assert anon.get("/metrics").status_code == 200
            assert '"auth": "none"' in proc.text() or "auth=none" in proc.text()
