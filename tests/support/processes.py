"""Real processes of a test (``orbit`` commands, workers, Flower): started in their own session,
their output in a log file, stopped with their pool children."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORBIT = str(REPO / ".venv" / "bin" / "orbit")


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # pool children of a dead main process


@contextmanager
def started(args: list[str], env: dict[str, str], log: Path) -> Iterator[Proc]:
    with log.open("wb") as fh:
        popen = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    proc = Proc(popen, log)
    try:
        yield proc
    finally:
        proc.stop()
