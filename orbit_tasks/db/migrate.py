"""Two Alembic chains: ``platform`` (archive + platform tables) and ``business`` (sender tables,
not part of the platform migrations). Driven programmatically; no ``alembic.ini`` needed.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Literal

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

Chain = Literal["platform", "business"]
MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLES = {"platform": "orbit_alembic_version", "business": "sender_alembic_version"}


def alembic_config(chain: Chain, url: str | None = None) -> Config:
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(MIGRATIONS / chain))
    cfg.attributes["version_table"] = VERSION_TABLES[chain]
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, chain: Chain, revision: str = "head") -> None:
    """Apply ``chain`` up to ``revision`` on ``engine``."""
    cfg = alembic_config(chain)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def render_sql(chain: Chain, url: str, revision: str = "head") -> str:
    """Offline (``--sql``) rendering of the DDL for the dialect of ``url`` (no server needed)."""
    cfg = alembic_config(chain, url)
    buf = io.StringIO()
    cfg.output_buffer = buf
    command.upgrade(cfg, revision, sql=True)
    return buf.getvalue()
