"""The schema start check of Celery processes, however they were started (SPEC §12,
docs/schema.md "Start checks").

``orbit worker ...`` and ``orbit beat`` check before they replace themselves with Celery and mark
the chains they checked in :data:`CHECKED_ENV`, so the process does not check twice. A worker or
beat started directly (``celery -A orbit_tasks.celery_app worker -Q orbit.control``) gets the
same check from the Celery signals in :mod:`orbit_tasks.celery_app`: the chains its queues need,
and the same one line and exit code as the CLI when a table is missing or differs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from orbit_tasks.queues import ARCHIVE_QUEUE_PREFIX, CONTROL_QUEUE, SENDER_QUEUE
from orbit_tasks.redaction import redact_url

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from orbit_tasks.db.schema_check import Chain

#: Chains already checked by the ``orbit`` command that started this process (comma-separated).
CHECKED_ENV = "ORBIT_SCHEMA_CHECKED"
#: The marker in :data:`CHECKED_ENV` of the replica check (:func:`require_source`).
SOURCE_CHECKED = "source"


def chains_of_queues(queues: Iterable[str]) -> list[Chain]:
    """The databases whose schema the tasks of ``queues`` use: archive and control tasks the
    platform database, the sender's tasks the business database. Other queues need none."""
    names = set(queues)
    chains: list[Chain] = []
    if CONTROL_QUEUE in names or any(q.startswith(ARCHIVE_QUEUE_PREFIX) for q in names):
        chains.append("platform")
    if SENDER_QUEUE in names:
        chains.append("business")
    return chains


def unchecked(chains: Iterable[Chain], env: Mapping[str, str]) -> list[Chain]:
    """``chains`` minus those the starting ``orbit`` command already checked."""
    done = set(env.get(CHECKED_ENV, "").split(","))
    return [c for c in chains if c not in done]


def reads_source(queues: Iterable[str]) -> bool:
    """Whether the tasks of ``queues`` read archive history (the archive queues do)."""
    return any(q.startswith(ARCHIVE_QUEUE_PREFIX) for q in queues)


def source_unchecked(env: Mapping[str, str]) -> bool:
    return SOURCE_CHECKED not in env.get(CHECKED_ENV, "").split(",")


def beat_chains(env: Mapping[str, str] | None = None) -> list[Chain]:
    """Beat schedules the archive tick (platform database) and the sender tick (business
    database). A deployment may run one side only (an application runs beat for its outbox
    alone), so beat checks the databases the environment names; with neither named, the
    embedded defaults of both (the demo)."""
    env = os.environ if env is None else env
    named: list[Chain] = []
    if env.get("ORBIT_DATABASE_URL"):
        named.append("platform")
    if env.get("ORBIT_SENDER_DATABASE_URL"):
        named.append("business")
    return named or ["platform", "business"]


def checked_marker(chains: Iterable[Chain]) -> str:
    return ",".join(chains)


def refuse_unless_ready(chains: Iterable[Chain], *, source: bool = False) -> None:
    """Check each chain's schema (unless already checked) and, with ``source``, the archive's
    replica (:func:`require_source`); on a failure print the CLI's one line on stderr and exit
    with its code (no traceback, no worker started)."""
    # Imported here: every `orbit` command imports this module; Alembic and the drivers (~0.3 s)
    # only when a check runs.
    from orbit_tasks.db.registry import business_engine, platform_engine
    from orbit_tasks.db.schema_check import require_schema
    from orbit_tasks.error_lines import describe_error

    try:
        for chain in unchecked(chains, os.environ):
            require_schema(platform_engine() if chain == "platform" else business_engine(), chain)
        if source and source_unchecked(os.environ):
            require_source()
    except Exception as exc:
        message, code = describe_error(exc)
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(code) from None


def require_source() -> None:
    """With ``ORBIT_ARCHIVE_SOURCE_URL`` set: the replica answers, every history table and the
    heartbeat table is defined there exactly as on the platform database, and the replica has
    executed no transaction the primary has not (docs/operations.md "Read from a replica").
    Raises the error the CLI words in one line; nothing without a replica."""
    # Imported here: as above (the drivers and the schema check only when a check runs).
    from orbit_tasks.db.platform_tables import heartbeat
    from orbit_tasks.db.registry import platform_engine, source_engine
    from orbit_tasks.db.schema_check import require_same_tables
    from orbit_tasks.platform.history import source_table_names
    from orbit_tasks.settings import get_settings

    url = get_settings().archive_source_url
    if url is None:
        return
    shown = f"ORBIT_ARCHIVE_SOURCE_URL {redact_url(url)!r}"
    names = [*source_table_names(), heartbeat.name]
    require_same_tables(platform_engine(), source_engine(), names, shown)
    require_contained(source_engine(), platform_engine(), shown)


def require_contained(replica: Engine, primary: Engine, shown: str) -> None:
    """Raise :class:`ReplicaDiverged` (one line starting with ``shown``) when the replica has
    executed transactions its primary has not (errant GTIDs, ``db/gtid.py``)."""
    # Imported here: as above.
    from orbit_tasks.db import gtid
    from orbit_tasks.errors import ReplicaDiverged

    with replica.connect() as theirs, primary.connect() as ours:
        found = gtid.errant_gtids(theirs, ours)
    if found:
        raise ReplicaDiverged(
            f"{shown}: the replica has executed transactions the platform database has not "
            f"(errant GTIDs {gtid.describe(found)}); the archive would read rows that are not "
            'the primary\'s (docs/operations.md "replica_diverged")'
        )
