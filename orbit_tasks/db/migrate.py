"""Two Alembic chains: ``platform`` (archive + platform tables) and ``business`` (sender tables,
not part of the platform migrations). Driven programmatically; no ``alembic.ini`` needed.

:func:`upgrade` also adopts tables that already exist (SPEC §12, docs/schema.md): created by hand
from the seed DDL or by the application's own migration tool. It compares them with the baseline
revision's frozen definitions first; if one differs it changes nothing (not even a version table)
and raises :class:`SchemaMismatch` (exit 3) listing the differences; if they match it creates only
the missing tables, records the baseline revision and continues to head. It never drops, alters or
rewrites an existing table and touches no row.
"""

from __future__ import annotations

import importlib
import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, MetaData, inspect, text
from sqlalchemy.engine import Connection

from orbit_tasks.db.engine import is_mysql
from orbit_tasks.db.migrations.frozen_0001 import create_statements
from orbit_tasks.db.schema_check import (
    CHAINS,
    MIGRATIONS,
    Chain,
    ChainSpec,
    Comparison,
    SchemaMismatch,
    chain_spec,
    compare_tables,
    difference_lines,
    head_revision,
    is_known_revision,
    recorded_revision,
    script_directory,
    unknown_revision,
)
from orbit_tasks.errors import ConflictError
from orbit_tasks.logs import log_action

logger = logging.getLogger("orbit.db.migrate")
VERSION_TABLES = {chain: spec.version_table for chain, spec in CHAINS.items()}
UPGRADE_LOCK_WAIT_SECONDS = 60


def alembic_config(chain: Chain, url: str | None = None) -> Config:
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(MIGRATIONS / chain))
    cfg.attributes["version_table"] = VERSION_TABLES[chain]
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@dataclass(frozen=True)
class UpgradeResult:
    chain: Chain
    previous: str | None  # the revision recorded before
    revision: str  # the revision recorded now
    created: tuple[str, ...]
    adopted: tuple[str, ...]

    @property
    def action(self) -> str:
        if self.adopted:
            return "adopted"
        if self.previous not in (None, self.revision):
            return "upgraded"  # also when the later revisions created tables
        if self.created:
            return "created"
        return "current"

    def message(self) -> str:
        db = chain_spec(self.chain).database
        if self.action == "current":
            return f"{db}: already current (revision {self.revision}); nothing changed"
        done = []
        if self.adopted:
            done.append(f"adopted {len(self.adopted)} existing tables")
        if self.created:
            done.append(f"created {len(self.created)} tables")
        if self.previous not in (None, self.revision) or not done:
            done.append(f"upgraded from {self.previous} to {self.revision}")
        return f"{db}: {', '.join(done)}; revision {self.revision} recorded"

    def to_json(self) -> dict[str, Any]:
        return {
            "database": self.chain,
            "action": self.action,
            "previous": self.previous,
            "revision": self.revision,
            "created": list(self.created),
            "adopted": list(self.adopted),
        }


def upgrade(engine: Engine, chain: Chain) -> UpgradeResult:
    """Bring ``chain`` to head on ``engine``, adopting matching tables that already exist."""
    spec = chain_spec(chain)
    with engine.connect() as conn, _upgrade_lock(conn, chain), conn.begin():
        previous = recorded_revision(conn, spec)
        if previous is not None and not is_known_revision(chain, previous):
            raise ConflictError(
                f"{spec.database}: {unknown_revision(previous, head_revision(chain))}"
            )
        existed = set(inspect(conn).get_table_names())
        adopted: list[str] = []
        if previous in (None, spec.baseline):
            baseline = spec.baseline_metadata()
            found = compare_tables(conn, baseline)
            if found.differences:
                raise SchemaMismatch(_mismatch_message(spec.database, spec.baseline, found))
            later, reached = _later_tables(conn, spec) if previous is None else ([], None)
            if found.present or previous is not None or later:  # else fresh: revisions run
                for statement in create_statements(baseline, only=found.missing):
                    conn.execute(statement)
                if previous is None:
                    adopted = found.present
                    _alembic(conn, chain, "stamp", spec.baseline)
            if later and reached:  # the application's tool created later revisions' tables too
                adopted = [*adopted, *later]
                _alembic(conn, chain, "stamp", reached)  # the revisions after it still run
        _alembic(conn, chain, "upgrade", "head")
        # every table of the head that did not exist before: the baseline's missing ones and
        # those of later revisions (p0001 -> p0002 creates the control tables)
        created = [t.name for t in spec.head_metadata().sorted_tables if t.name not in existed]
        result = UpgradeResult(
            chain, previous, head_revision(chain), tuple(created), tuple(adopted)
        )
    log_action(
        logger,
        "db.upgraded",
        database=chain,
        outcome=result.action,
        previous=previous,
        revision=result.revision,
        created=len(created),
        adopted=len(adopted),
    )
    return result


def _later_revisions(spec: ChainSpec) -> list[tuple[str, list[str]]]:
    """(revision, the names of the tables it adds) for every revision after the baseline, oldest
    first, from each revision's frozen copy (``migrations/<chain>/<revision>_tables.py``). A
    table an earlier revision added and a later one replaces (p0004's waits table) belongs to
    the earlier one: the later revision adds nothing, so it is never adopted, it runs."""
    revisions = list(script_directory(spec.chain).walk_revisions("base", "heads"))
    out: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for rev in reversed(revisions):
        if rev.revision == spec.baseline:
            continue
        module = importlib.import_module(
            f"orbit_tasks.db.migrations.{spec.chain}.{rev.revision}_tables"
        )
        added = sorted(set(module.metadata.tables) - seen)
        seen.update(added)
        out.append((rev.revision, added))
    return out


def _later_tables(conn: Connection, spec: ChainSpec) -> tuple[list[str], str | None]:
    """On a database without a record: the tables of the later revisions (beyond the baseline)
    that already exist and match the head, revision by revision from the oldest, and the last
    revision whose tables all exist (then they are adopted and that revision is recorded; the
    revisions after it run). ([], None) when none exists. Some but not all of one revision's
    tables, one that differs, or tables of a revision after one that is missing: refused like a
    baseline table that differs, nothing changed."""
    head = spec.head_metadata()
    adopted: list[str] = []
    reached: str | None = None
    revisions = _later_revisions(spec)
    for i, (revision, names) in enumerate(revisions):
        if not names:
            # It only changes tables an earlier revision added (p0004): those were compared with
            # the head above, so it is adopted with the next revision that adds tables that
            # exist, and runs when none does.
            continue
        found = compare_tables(conn, _subset(head, names))
        if not found.present:
            after = [n for _r, later in revisions[i + 1 :] for n in later]
            if after and compare_tables(conn, _subset(head, after)).present:
                raise SchemaMismatch(
                    f"{spec.database}: tables of a revision after {revision} exist but those of "
                    f"{revision} ({', '.join(names)}) do not; create them as well; nothing was "
                    "changed"
                )
            break
        if found.differences:
            raise SchemaMismatch(_mismatch_message(spec.database, revision, found))
        if found.missing:
            raise SchemaMismatch(
                f"{spec.database}: tables {', '.join(found.present)} exist but "
                f"{', '.join(found.missing)} do not (revision {revision} adds them "
                "together); create the missing ones as well, or drop the others; "
                "nothing was changed"
            )
        adopted += found.present
        reached = revision
    return adopted, reached


def _subset(head: MetaData, names: list[str]) -> MetaData:
    out = MetaData()
    for name in names:
        head.tables[name].to_metadata(out)
    return out


def _mismatch_message(database: str, revision: str, found: Comparison) -> str:
    head = (
        f"{database}: {len(found.differences)} existing table(s) differ from revision {revision}; "
        "nothing was changed"
    )
    return "\n".join([head, *difference_lines(found.differences)])


def _alembic(conn: Connection, chain: Chain, action: str, revision: str) -> None:
    cfg = alembic_config(chain)
    cfg.attributes["connection"] = conn
    if action == "stamp":
        command.stamp(cfg, revision)
    else:
        command.upgrade(cfg, revision)


@contextmanager
def _upgrade_lock(conn: Connection, chain: Chain) -> Iterator[None]:
    """One upgrade per database and chain at a time. MySQL DDL commits implicitly, so two racing
    upgrades would both see a table missing (or one the other's tables without its version row);
    a named server lock, held until the upgrade has committed, serialises them (SQLite's
    ``BEGIN IMMEDIATE`` transaction already does)."""
    if not is_mysql(conn):
        yield
        return
    name = "LEFT(CONCAT('orbit.upgrade.', :chain, '.', DATABASE()), 64)"
    got = conn.execute(
        text(f"SELECT GET_LOCK({name}, :wait)"),
        {"chain": chain, "wait": UPGRADE_LOCK_WAIT_SECONDS},
    ).scalar()
    conn.commit()  # the lock belongs to the session; the upgrade runs in its own transaction
    if got != 1:
        raise ConflictError(
            f"another `{chain_spec(chain).upgrade_command}` holds this database for more than "
            f"{UPGRADE_LOCK_WAIT_SECONDS} s; retry when it has finished"
        )
    try:
        yield  # released only after the upgrade's transaction has committed or rolled back
    finally:
        conn.execute(text(f"SELECT RELEASE_LOCK({name})"), {"chain": chain})
        conn.commit()


def current(engine: Engine, chain: Chain) -> str | None:
    """The revision recorded in ``chain``'s version table (``None``: none recorded)."""
    with engine.connect() as conn:
        return recorded_revision(conn, chain_spec(chain))


def render_sql(chain: Chain, url: str, revision: str = "head") -> str:
    """Offline (``--sql``) rendering of the DDL for the dialect of ``url`` (no server needed)."""
    cfg = alembic_config(chain, url)
    buf = io.StringIO()
    cfg.output_buffer = buf
    command.upgrade(cfg, revision, sql=True)
    return buf.getvalue()
