"""The Celery app, configured from the top-level ``celeryconfig.py``.

Celery messages are wake-ups only: ownership lives in the database (leases), so duplicates and
losses are harmless. Task modules register themselves via ``include``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

TASK_MODULES = ["orbit_tasks.archive.tasks", "orbit_tasks.sender.tasks"]


def _load_config_module() -> Any:
    try:
        return importlib.import_module("celeryconfig")
    except ModuleNotFoundError:
        # Installed without the repository root on sys.path: fall back to the checkout's file.
        root = Path(__file__).resolve().parent.parent
        sys.path.insert(0, str(root))
        return importlib.import_module("celeryconfig")


app = Celery("orbit", include=TASK_MODULES)
app.config_from_object(_load_config_module())


@worker_process_init.connect
def _fresh_connections_in_child(**_: Any) -> None:
    """A forked child must not reuse the parent's MySQL connections."""
    from orbit_tasks.db.registry import dispose_all_for_fork

    dispose_all_for_fork()
