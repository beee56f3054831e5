"""The reference platform API (``orbit api serve``): the outbox sender's real counterpart."""

from __future__ import annotations

from orbit_tasks.api.app import create_app

__all__ = ["create_app"]
