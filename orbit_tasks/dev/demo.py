"""``orbit demo``: the whole product end to end on the embedded default.

Everything runs as the operator would run it — ``orbit`` CLI commands and real worker processes —
on SQLite files, local volume folders and Celery's filesystem broker under ``var/demo/``:

1. migrate both databases; create a namespace, a volume, retention policies and archive plans;
   generate settled and unsettled history;
2. one ``orbit archive tick``; a real ``orbit worker archive`` drains the jobs; every job is
   verified from its files and exported;
3. the outbox sender: a credential, the reference platform API, an application enqueueing frozen
   submissions inside its own transaction, ``orbit beat`` + ``orbit worker sender`` relaying
   them until every row is ACCEPTED with one platform task per key.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from orbit_tasks.db.engine import make_engine
from orbit_tasks.errors import InvalidInput
from orbit_tasks.settings import get_settings

KINDS = ("tasks", "events", "deliveries")
ROOTS = 400
OPERATIONS = 25


def _orbit_bin() -> list[str]:
    exe = Path(sys.executable).with_name("orbit")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "orbit_tasks.cli.main"]


@contextlib.contextmanager
def _app_settings(root: Path) -> Iterator[None]:
    """This process's settings as the demo's application sees them: ORBIT_VAR_DIR is the demo's
    folder, no CELERY_BROKER_URL (the embedded filesystem broker)."""
    saved = {k: os.environ.get(k) for k in ("ORBIT_VAR_DIR", "CELERY_BROKER_URL")}
    os.environ["ORBIT_VAR_DIR"] = str(root)
    os.environ.pop("CELERY_BROKER_URL", None)
    get_settings.cache_clear()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        get_settings.cache_clear()


class Demo:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.env = dict(os.environ)
        for key in list(self.env):
            if key.startswith("ORBIT_") or key == "CELERY_BROKER_URL":
                del self.env[key]
        self.env.update(
            ORBIT_VAR_DIR=str(self.root),
            ORBIT_TICK_SECONDS="5",
            ORBIT_SENDER_TICK_SECONDS="1",
            ORBIT_ARCHIVE_LEASE_SECONDS="30",
            ORBIT_ARCHIVE_SLICE_SECONDS="5",
            ORBIT_ACTOR="demo",
        )
        self.procs: list[subprocess.Popen[bytes]] = []

    # --- plumbing ---------------------------------------------------------------------------

    def say(self, text: str) -> None:
        click.secho(text, fg="cyan", bold=True)

    def orbit(self, *args: str, env: dict[str, str] | None = None) -> Any:
        """Run one ``orbit`` command; parse its ``--json`` output when asked for."""
        cmd = [*_orbit_bin(), *args]
        done = subprocess.run(cmd, env=env or self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise click.ClickException(
                f"`orbit {' '.join(args)}` exited {done.returncode}: {done.stderr.strip()}"
            )
        click.echo(f"  $ orbit {' '.join(args)}")
        out = done.stdout.strip()
        if "--json" in args:
            return json.loads(out)  # one JSON document (docs/cli.md)
        for line in out.splitlines()[:6]:
            click.echo(f"    {line}")
        return out

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [*_orbit_bin(), *args],
            env=env or self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        click.echo(f"  started `orbit {' '.join(args)}` (pid {proc.pid}, log {name}.log)")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            for proc in self.procs:
                if proc.poll() is not None:
                    raise click.ClickException(f"a demo process died while waiting for {what}")
            time.sleep(1)
        raise click.ClickException(f"timed out after {timeout:.0f}s waiting for {what}")

    # --- the story --------------------------------------------------------------------------

    def run(self) -> None:
        prepare_dir(self.root)
        try:
            self.archive()
            self.sender()
        finally:
            self.stop_all()
        self.say("\nDemo complete. Everything it made is under " + str(self.root))
        job = self.items("job", "list", "acme")[0]["id"]
        for line in closing_lines(self.root, Path.cwd(), job):
            click.echo(line)

    def archive(self) -> None:
        self.say("1. Platform set-up (SQLite + local volume)")
        self.orbit("db", "upgrade")
        self.orbit("sender", "db", "upgrade")
        self.orbit("namespace", "create", "acme", "--json")
        volume = self.root / "volume-a"
        storage = self.orbit(
            "storage", "init", str(volume), "--create", "--label", "demo-a", "--json"
        )
        storage_id = storage["id"]
        self.orbit("queue", "create", "acme", "billing")
        for kind in KINDS:
            self.orbit(
                "dev",
                "seed-history",
                "acme",
                "--kind",
                kind,
                "--roots",
                str(ROOTS),
                "--days",
                "3",
                "--seed",
                "7",
            )
            rev = self.orbit("policy", "set", "acme", kind, "--archive-after", "1h", "--json")
            self.orbit(
                "plan",
                "set",
                "acme",
                kind,
                "--storage",
                storage_id,
                "--interval",
                "1d",
                "--batch-size",
                "50",
                "--max-bytes",
                "64MiB",
                "--policy-revision",
                str(rev["revision"]),
                "--enable",
            )

        self.say("2. One archive tick, then a real archive worker drains the jobs")
        self.orbit("archive", "tick")
        self.start(
            "worker-archive",
            "worker",
            "archive",
            "--volume",
            str(volume),
            "--name",
            "demo-archive@%h",
        )

        def all_done() -> bool:
            jobs = self.items("job", "list", "acme")
            states = [j["state"] for j in jobs]
            if any(s == "FAILED" for s in states):
                raise click.ClickException(f"a demo job failed: {jobs}")
            return len(states) == len(KINDS) and all(s == "SUCCEEDED" for s in states)

        self.wait_for("archive jobs to succeed", all_done)
        self.stop_all()
        for job in self.items("job", "list", "acme"):
            job_id = job["id"]
            self.orbit("job", "verify", "acme", job_id, "--volume", str(volume))
            click.echo(
                f"    {job['kind']}: {job['roots']} roots in {job['batches']} batches, "
                f"{job['bytes']} bytes, attempts {job['attempts']}"
            )
        first = self.items("job", "list", "acme")[0]
        exported = self.orbit_raw("job", "export", "acme", first["id"], "--volume", str(volume))
        click.echo(f"    export of the {first['kind']} job: {len(exported.splitlines())} roots")

    def sender(self) -> None:
        self.say("3. Outbox sender -> reference platform API")
        cred = self.orbit("credential", "create", "acme", "--queues", "billing", "--json")
        port = _free_port()
        api_url = f"http://127.0.0.1:{port}"
        self.start("api", "api", "serve", "--port", str(port))
        self.wait_for("the platform API", lambda: _answers(api_url))
        queue = self.items("queue", "list", "acme")[0]
        ns = self.items("namespace", "list")[0]
        self.enqueue(ns["id"], queue["id"])
        env = dict(self.env, ORBIT_API_URL=api_url, ORBIT_API_TOKEN=cred["token"])
        self.start("beat", "beat", env=env)
        self.start("worker-sender", "worker", "sender", "--name", "demo-sender@%h", env=env)

        def accepted() -> bool:
            rows = self.items("sender", "list")
            return len(rows) == OPERATIONS and all(r["state"] == "ACCEPTED" for r in rows)

        self.wait_for("every outbox row to be ACCEPTED", accepted)
        row = self.items("sender", "list")[0]
        click.echo(
            f"    {OPERATIONS} rows ACCEPTED; e.g. {row['operation_id']} -> task {row['task_id']}"
        )

    def enqueue(self, ns_hex: str, queue_hex: str) -> None:
        """What an application does: business write + frozen submission, one transaction."""
        # Imported here: the sender package (httpx, ~0.25 s) only for the application step, so that
        # every `orbit` command (which imports this module) stays light.
        from orbit_tasks.sender import enqueue

        engine = make_engine(f"sqlite:///{self.root / 'business.sqlite3'}")
        # The application's wake-ups go to the demo's own filesystem broker, inside the demo's
        # folder (before: ./var/broker of the working directory, outside var/demo/).
        with _app_settings(self.root), engine.begin() as conn:
            for i in range(OPERATIONS):
                enqueue(
                    conn,
                    namespace_id=ns_hex,
                    queue_id=queue_hex,
                    operation_id=f"{i:032x}",
                    request={
                        "invoice": i,
                        "amount": Decimal("12345678901234567890.01"),
                        "memo": "paid 🚀",
                    },
                    source_ref=f"invoice:{i}",
                )
        engine.dispose()
        click.echo(f"    application enqueued {OPERATIONS} submissions in one transaction")

    def items(self, *args: str) -> list[Any]:
        """The items of a list command (docs/cli.md: ``{"items": [...], "next": cursor}``)."""
        return list(json.loads(self.orbit_raw(*args, "--json"))["items"])

    def orbit_raw(self, *args: str) -> str:
        done = subprocess.run([*_orbit_bin(), *args], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise click.ClickException(f"`orbit {' '.join(args)}`: {done.stderr.strip()}")
        return done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    import httpx  # imported here: ~0.1 s of start-up for every `orbit` command otherwise

    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def closing_lines(root: Path, cwd: Path, job_id: str) -> list[str]:
    """What the demo prints last (issue 27): how to look at its state -- every command needs
    ``ORBIT_VAR_DIR`` pointing at the demo's folder, since without it ``orbit`` uses the default
    ``var/`` (another database, empty) -- and what to read or run next. The commands are ones
    that work as printed, from ``cwd`` (the folder relative to it when it lies inside)."""
    root = root.resolve()
    try:
        var_dir = str(root.relative_to(cwd.resolve()))
    except ValueError:
        var_dir = str(root)
    volume = str(Path(var_dir) / "volume-a")
    return [
        "",
        "Look at the demo's state: its databases are under its folder, so give every command",
        f"ORBIT_VAR_DIR={var_dir} (without it `orbit` uses var/: another database, empty):",
        f"  export ORBIT_VAR_DIR={var_dir}",
        "  orbit job list acme                 # the archive jobs (state, roots, waiting)",
        f"  orbit job show acme {job_id}   # one job: range, counters, waits",
        f"  orbit job verify acme {job_id} --volume {volume}",
        "  orbit sender list                   # the outbox rows and their states",
        "  orbit archive controls              # pauses, throttles, windows in force",
        "  orbit db current                    # says which database it read",
        "(`orbit` is .venv/bin/orbit: `source .venv/bin/activate` puts it on the PATH.)",
        "",
        "What next:",
        '  README.md "The archive cycle with the CLI alone": the same on MariaDB, from nothing',
        "  docs/operations.md: the runbook (alerts, error codes, wait reasons)",
        "  make test: the test suite (installs the test tools the demo does not need)",
    ]


DEMO_MARKER = ".orbit-demo"


def prepare_dir(root: Path) -> None:
    """Empty ``root`` for a new run, but only when it is missing, empty, or made by an earlier
    demo (it holds :data:`DEMO_MARKER`): a ``--dir`` naming anything else, a home directory or an
    archive volume, is refused and nothing is deleted."""
    if root.exists():
        if not root.is_dir():
            raise InvalidInput(f"--dir {root} is not a directory")
        if any(root.iterdir()) and not (root / DEMO_MARKER).exists():
            raise InvalidInput(
                f"--dir {root} is not empty and was not made by `orbit demo` (no {DEMO_MARKER} "
                "in it); name a new or empty directory"
            )
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / DEMO_MARKER).write_text("made by `orbit demo`; its next run empties this directory\n")


def run_demo(root: Path) -> None:
    Demo(root).run()
