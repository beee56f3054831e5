"""Real filesystems for fault tests: a small tmpfs to provoke ENOSPC, or a read-only one (EROFS).

Mounting needs root (CAP_SYS_ADMIN). CI and the dev machines run as root, so there a failed
mount is a test failure, never a silent skip; only a non-root developer gets a skip (with why).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(mnt: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); CI runs as root")
    mnt.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={size}" + (",ro" if read_only else ""),
            "tmpfs",
            str(mnt),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, f"mount of a {size} tmpfs failed as root: {proc.stderr.strip()}"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


@contextmanager
def full_tmpfs(mnt: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs filled to ENOSPC by one file named ``filler``."""
    with small_tmpfs(mnt, "64k") as root:
        with open(root / "filler", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass  # ENOSPC: the disk is full now
        yield root
