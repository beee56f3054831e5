"""Alembic environment of the platform chain: runs the shared ``migrations/environment.py``."""

from __future__ import annotations

from orbit_tasks.db.migrations.environment import run

run()
