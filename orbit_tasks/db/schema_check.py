"""Is a database's schema the one this release expects? (SPEC §12, docs/schema.md)

Two chains: ``platform`` (archive + platform tables) and ``business`` (the sender's tables, which
the application may own: they are checked by shape alone, a migration record of ours is not
required). A check reads what the server reports (``information_schema`` on MySQL/MariaDB,
``sqlite_master`` and ``PRAGMA`` on SQLite), compares every table with the expected definition
(``schema_facts.py``) and reads the recorded Alembic revision. It never writes.

Processes call :func:`require_schema` at start and refuse a missing or different schema with one
line naming the table and the command that fixes it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Engine, MetaData, bindparam, create_engine, inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from orbit_tasks.db.faults import driver_code, is_transient_db
from orbit_tasks.db.schema_facts import (
    ColumnFacts,
    TableFacts,
    describe_index,
    expected_mysql_facts,
    mysql_reported_facts,
    normalize_default,
    normalize_type,
    table_differences,
)
from orbit_tasks.db.session_check import warn_unless_bounded
from orbit_tasks.db.sql_expr import constraints_of_create_table
from orbit_tasks.errors import ConflictError, InvalidInput, OrbitError
from orbit_tasks.logs import log_action

Chain = Literal["platform", "business"]
MIGRATIONS = Path(__file__).parent / "migrations"
logger = logging.getLogger("orbit.db.schema_check")


class SchemaNotReady(OrbitError):
    """A process refuses to start: a table is missing or differs, or the revision is not head."""


class SchemaMismatch(ConflictError):
    """``db upgrade`` refuses to adopt tables that differ from the expected definition."""


@dataclass(frozen=True)
class ChainSpec:
    chain: Chain
    database: str
    version_table: str
    upgrade_command: str
    check_command: str
    baseline: str  # the revision whose tables an unrecorded database may already hold
    record_required: bool

    def head_metadata(self) -> MetaData:
        """The tables at the head revision: the live table modules."""
        # Imported here: only the chain asked for is loaded (a business-only deployment never
        # loads the platform's table modules, which register history kinds on import).
        if self.chain == "platform":
            from orbit_tasks.db import history_tables  # noqa: F401 - registers the sources
            from orbit_tasks.db.platform_tables import metadata
        else:
            from orbit_tasks.db.business_tables import metadata
        return metadata

    def baseline_metadata(self) -> MetaData:
        """The tables of the baseline revision, from its frozen copy."""
        # Imported here: the frozen baseline copies are read only by upgrade/check of that chain.
        if self.chain == "platform":
            from orbit_tasks.db.migrations.platform.p0001_tables import metadata
        else:
            from orbit_tasks.db.migrations.business.b0001_tables import metadata
        return metadata


CHAINS: dict[Chain, ChainSpec] = {
    "platform": ChainSpec(
        "platform",
        "platform database",
        "orbit_alembic_version",
        "orbit db upgrade",
        "orbit db check",
        "p0001",
        record_required=True,
    ),
    "business": ChainSpec(
        "business",
        "business database",
        "sender_alembic_version",
        "orbit sender db upgrade",
        "orbit sender db check",
        "b0001",
        record_required=False,  # the application's own migration tool may own these tables
    ),
}


def chain_spec(chain: str) -> ChainSpec:
    if chain not in CHAINS:
        raise InvalidInput(f"schema chain {chain!r} is unknown (allowed: platform, business)")
    return CHAINS[chain]


@functools.cache
def script_directory(chain: Chain) -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS / chain))


def head_revision(chain: Chain) -> str:
    head = script_directory(chain).get_current_head()
    assert head is not None
    return head


def is_known_revision(chain: Chain, revision: str) -> bool:
    try:
        return script_directory(chain).get_revision(revision) is not None
    except CommandError:
        return False


def recorded_revision(conn: Connection, spec: ChainSpec) -> str | None:
    """The revision in the chain's version table; ``None`` without the table or with it empty."""
    ctx = MigrationContext.configure(conn, opts={"version_table": spec.version_table})
    return ctx.get_current_revision()


# --- reading what the server reports ---------------------------------------------------------


def existing_tables(conn: Connection, names: Sequence[str]) -> list[str]:
    present = set(inspect(conn).get_table_names())
    return [n for n in names if n in present]


def _dialect_kind(conn: Connection) -> str:
    name = conn.dialect.name
    if name in ("mysql", "mariadb"):
        return "mysql"
    if name == "sqlite":
        return "sqlite"
    raise OrbitError(f"schema checks support MySQL/MariaDB and SQLite, not {name}")


def reported_facts(conn: Connection, names: Sequence[str]) -> dict[str, TableFacts]:
    """Facts of the tables among ``names`` that exist."""
    names = existing_tables(conn, names)
    if not names:
        return {}
    if _dialect_kind(conn) == "mysql":
        return _mysql_facts(conn, names)
    return {n: _sqlite_facts(conn, n) for n in names}


def expected_facts(
    conn: Connection, metadata: MetaData, names: Sequence[str]
) -> dict[str, TableFacts]:
    """Facts the tables ``names`` of ``metadata`` should have on the server behind ``conn``."""
    tables = [metadata.tables[n] for n in names]
    if _dialect_kind(conn) == "mysql":
        collation = conn.execute(
            text(
                "SELECT DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA "
                "WHERE SCHEMA_NAME = DATABASE()"
            )
        ).scalar_one()
        return {t.name: expected_mysql_facts(t, conn.dialect, str(collation)) for t in tables}
    # SQLite keeps declared types and default texts as written: build the tables in memory and
    # read them back the same way, so both sides get the same spelling.
    scratch = create_engine("sqlite://")
    try:
        metadata.create_all(scratch, tables=tables)
        with scratch.connect() as mem:
            return {t.name: _sqlite_facts(mem, t.name) for t in tables}
    finally:
        scratch.dispose()


_MYSQL_QUERIES = {
    "tables": """SELECT TABLE_NAME, ENGINE, TABLE_COLLATION, TABLE_COMMENT
        FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :t""",
    "columns": """SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, EXTRA,
        CHARACTER_SET_NAME, COLLATION_NAME, COLUMN_COMMENT
        FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :t
        ORDER BY TABLE_NAME, ORDINAL_POSITION""",
    "indexes": """SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME, SUB_PART,
        COLLATION, INDEX_TYPE
        FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :t
        ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX""",
    # MySQL 8's CHECK_CONSTRAINTS has no TABLE_NAME (MariaDB's has): join TABLE_CONSTRAINTS.
    # MariaDB names CHECKs per table, so the join also matches the table there.
    "checks_mariadb": """SELECT tc.TABLE_NAME, tc.CONSTRAINT_NAME, cc.CHECK_CLAUSE
        FROM information_schema.TABLE_CONSTRAINTS tc
        JOIN information_schema.CHECK_CONSTRAINTS cc
          ON cc.CONSTRAINT_SCHEMA = tc.CONSTRAINT_SCHEMA
         AND cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME AND cc.TABLE_NAME = tc.TABLE_NAME
        WHERE tc.CONSTRAINT_SCHEMA = DATABASE() AND tc.CONSTRAINT_TYPE = 'CHECK'
          AND tc.TABLE_NAME IN :t""",
    "checks_mysql": """SELECT tc.TABLE_NAME, tc.CONSTRAINT_NAME, cc.CHECK_CLAUSE, tc.ENFORCED
        FROM information_schema.TABLE_CONSTRAINTS tc
        JOIN information_schema.CHECK_CONSTRAINTS cc
          ON cc.CONSTRAINT_SCHEMA = tc.CONSTRAINT_SCHEMA
         AND cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME
        WHERE tc.CONSTRAINT_SCHEMA = DATABASE() AND tc.CONSTRAINT_TYPE = 'CHECK'
          AND tc.TABLE_NAME IN :t""",
}


def _mysql_facts(conn: Connection, names: list[str]) -> dict[str, TableFacts]:
    mariadb = bool(getattr(conn.dialect, "is_mariadb", False))
    keys = ["tables", "columns", "indexes", "checks_mariadb" if mariadb else "checks_mysql"]
    rows: dict[str, dict[str, list[Any]]] = {}
    for key in keys:
        stmt = text(_MYSQL_QUERIES[key]).bindparams(bindparam("t", expanding=True))
        per_table: dict[str, list[Any]] = {n: [] for n in names}
        for row in conn.execute(stmt, {"t": names}):
            per_table[row.TABLE_NAME].append(row)
        rows[key.split("_")[0]] = per_table
    return {
        n: mysql_reported_facts(
            n,
            rows["tables"][n][0],
            rows["columns"][n],
            rows["indexes"][n],
            rows["checks"][n],
            mariadb,
        )
        for n in names
    }


def _sqlite_facts(conn: Connection, name: str) -> TableFacts:
    create_sql = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :n"), {"n": name}
    ).scalar_one()
    columns = []
    primary: list[tuple[int, str]] = []
    for cid_row in conn.execute(text("SELECT * FROM pragma_table_info(:n)"), {"n": name}):
        columns.append(
            ColumnFacts(
                name=cid_row.name,
                type=normalize_type(cid_row.type or ""),
                nullable=not cid_row.notnull,
                default=normalize_default(cid_row.dflt_value),
            )
        )
        if cid_row.pk:
            primary.append((cid_row.pk, cid_row.name))
    indexes: dict[str, str] = {}
    if primary:
        indexes["PRIMARY"] = describe_index(True, [n for _, n in sorted(primary)])
    for idx in conn.execute(text("SELECT * FROM pragma_index_list(:n)"), {"n": name}):
        if idx.origin != "c":  # primary key and UNIQUE constraints: named in the SQL text below
            continue
        cols = [
            r.name or "(expression)"
            for r in conn.execute(
                text("SELECT * FROM pragma_index_info(:i) ORDER BY seqno"), {"i": idx.name}
            )
        ]
        desc = describe_index(bool(idx.unique), cols)
        indexes[idx.name] = desc + (" (partial)" if idx.partial else "")
    written = constraints_of_create_table(create_sql)
    for uq_name, uq_cols in written.uniques.items():
        indexes[uq_name] = describe_index(True, list(uq_cols))
    return TableFacts(name, tuple(columns), indexes, written.checks)


# --- comparing and reporting -----------------------------------------------------------------


@dataclass
class Comparison:
    present: list[str]
    missing: list[str]
    differences: dict[str, list[str]]


def compare_tables(conn: Connection, metadata: MetaData) -> Comparison:
    """Every table of ``metadata``: missing, or present with its differences (if any)."""
    names = [t.name for t in metadata.sorted_tables]
    actual = reported_facts(conn, names)
    present = [n for n in names if n in actual]
    expected = expected_facts(conn, metadata, present)
    differences = {}
    for name in present:
        lines = table_differences(expected[name], actual[name])
        if lines:
            differences[name] = lines
    return Comparison(present, [n for n in names if n not in actual], differences)


def difference_lines(differences: dict[str, list[str]]) -> list[str]:
    """The differences table by table, indented under each table's name."""
    out = []
    for table, diffs in differences.items():
        out.append(f"  {table}:")
        out += [f"    {d}" for d in diffs]
    return out


def unknown_revision(recorded: str, head: str) -> str:
    return (
        f"revision {recorded} is recorded but unknown to this orbit-tasks (head {head}): "
        "the database was upgraded by a newer release"
    )


@dataclass
class SchemaReport:
    spec: ChainSpec
    recorded: str | None
    head: str
    tables: list[str]
    missing: list[str] = field(default_factory=list)
    differences: dict[str, list[str]] = field(default_factory=dict)
    revision_problem: str | None = None

    @property
    def ok(self) -> bool:
        return not self.missing and not self.differences and self.revision_problem is None

    def summary(self) -> str:
        db = self.spec.database
        if self.recorded:
            where = f"revision {self.recorded}"
        elif self.spec.record_required:
            where = "no revision recorded"
        else:
            where = "no migration record of ours (tables verified by shape)"
        if self.ok:
            return f"{db}: {where}, head {self.head}; {len(self.tables)} tables match"
        return f"{db}: {where}, head {self.head}; NOT ready"

    def lines(self) -> list[str]:
        """Everything a person needs: the state, then each problem, table by table."""
        out = [self.summary()]
        if self.revision_problem:
            out.append(f"  {self.revision_problem}")
        if self.missing:
            out.append(
                f"  missing tables: {', '.join(self.missing)} (`{self.spec.upgrade_command}` "
                "creates them)"
            )
        return out + difference_lines(self.differences)

    def one_line(self) -> str:
        """The first problem in one line, naming the table and the command that fixes it (a table
        that differs first: `db upgrade` would refuse it)."""
        db, spec = self.spec.database, self.spec
        if self.differences:
            table, diffs = next(iter(self.differences.items()))
            more = f"; {len(diffs) - 1} more" if len(diffs) > 1 else ""
            return (
                f"{db}: table {table} differs from the expected schema ({diffs[0]}{more}); "
                f"`{spec.check_command}` lists every difference (docs/schema.md)"
            )
        if self.missing:
            more = f" (and {len(self.missing) - 1} more)" if len(self.missing) > 1 else ""
            return f"{db}: table {self.missing[0]} is missing{more}; run `{spec.upgrade_command}`"
        return f"{db}: {self.revision_problem}"

    def to_json(self) -> dict[str, Any]:
        return {
            "database": self.spec.chain,
            "ok": self.ok,
            "revision": self.recorded,
            "head": self.head,
            "tables": len(self.tables),
            "missing": self.missing,
            "differences": self.differences,
            "revision_problem": self.revision_problem,
        }


def inspect_schema_on(conn: Connection, chain: Chain) -> SchemaReport:
    spec = chain_spec(chain)
    head = head_revision(chain)
    recorded = recorded_revision(conn, spec)
    metadata = spec.head_metadata()
    report = SchemaReport(spec, recorded, head, [t.name for t in metadata.sorted_tables])
    if recorded is not None and not is_known_revision(chain, recorded):
        report.revision_problem = unknown_revision(recorded, head)
        return report
    if recorded is not None and recorded != head:
        report.revision_problem = (
            f"revision {recorded} is recorded, head is {head}; run `{spec.upgrade_command}`"
        )
        return report
    found = compare_tables(conn, metadata)
    report.missing, report.differences = found.missing, found.differences
    if recorded is None and spec.record_required:
        report.revision_problem = f"no schema revision recorded; run `{spec.upgrade_command}`"
    return report


def inspect_schema(engine: Engine, chain: Chain) -> SchemaReport:
    """``db check``: the recorded revision and every table compared with the head (read-only)."""
    with engine.connect() as conn:
        return inspect_schema_on(conn, chain)


def require_schema(engine: Engine, chain: Chain, *, allow_unreachable: bool = False) -> None:
    """Raise :class:`SchemaNotReady` (one line) unless ``chain``'s schema is at head and matches.

    The start check of workers, beat, the API and the exporter. An unreachable database raises
    the driver's error (the CLI prints "database unavailable"), unless ``allow_unreachable``: a
    server that answers 503 while its database is down (the API, the exporter) starts anyway,
    unchecked, and says so in its log."""
    try:
        report = inspect_schema(engine, chain)
    except OperationalError as exc:
        if not (allow_unreachable and is_transient_db(exc)):
            raise
        log_action(
            logger,
            "db.schema.unchecked",
            logging.WARNING,
            database=chain,
            reason="database unavailable",
            driver_code=driver_code(exc),
        )
        return
    if not report.ok:
        raise SchemaNotReady(report.one_line())
    warn_unless_bounded(engine, chain)


def require_same_tables(primary: Engine, replica: Engine, names: Sequence[str], shown: str) -> None:
    """Raise :class:`SchemaNotReady` (one line starting with ``shown``: the replica's variable and
    URL, password hidden)
    unless every table of ``names`` exists on ``replica`` exactly as on ``primary``: the same
    columns (types, nullability, defaults, collations, order), indexes, CHECKs and options,
    compared as ``db check`` compares them (docs/schema.md). An unreachable server raises the
    driver's error (the CLI prints "database unavailable" naming the variable)."""
    with primary.connect() as conn:
        want = reported_facts(conn, names)
    with replica.connect() as conn:
        got = reported_facts(conn, names)
    for name in names:
        if name not in want:
            continue  # the primary's own schema check names a table it lacks
        if name not in got:
            raise SchemaNotReady(
                f"{shown}: table {name} is missing on the replica (the archive reads it there)"
            )
        diffs = table_differences(want[name], got[name])
        if diffs:
            more = f"; {len(diffs) - 1} more" if len(diffs) > 1 else ""
            raise SchemaNotReady(
                f"{shown}: table {name} differs from the platform database's ({diffs[0]}{more}); "
                "the archive reads it there and needs the same definition"
            )
    warn_unless_bounded(replica, "archive source")  # its sessions carry the platform's bounds
