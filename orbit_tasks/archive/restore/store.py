"""Every SQL statement of a restore (``orbit job|archive restore``, docs/archive-format.md):
the SUCCEEDED jobs of a (namespace, kind) on the platform database, whether a target is the
live source database, and on the target: tables made or checked, existing rows read by key,
missing rows inserted. The archive's source rows are never touched here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, MetaData, Table, and_, event, inspect, or_, select, text

from orbit_tasks.archive.format.tables import (
    SourceSchema,
    TableSpec,
    sqlalchemy_table,
)
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.restore.rows import check_columns, primary_key_at
from orbit_tasks.db.engine import is_mysql
from orbit_tasks.db.platform_tables import archive_jobs as J
from orbit_tasks.errors import ConflictError

JOB_PAGE = 500


# --------------------------------------------------------------------------- platform side


def succeeded_jobs_query(
    ns_id: bytes, kind: str, after: tuple[datetime, bytes] | None, limit: int
) -> Any:
    """One page of SUCCEEDED jobs of (namespace, kind) in creation order, on ix_archive_job_list
    (keyset in the expanded form)."""
    cond = [J.c.namespace_id == ns_id, J.c.kind == kind, J.c.state == JobState.SUCCEEDED.value]
    if after is not None:
        t, i = after
        cond.append(or_(J.c.created_at > t, and_(J.c.created_at == t, J.c.id > i)))
    return select(J).where(*cond).order_by(J.c.created_at, J.c.id).limit(limit)


def succeeded_jobs(
    conn: Connection, ns_id: bytes, kind: str, created_after: datetime | None
) -> Iterator[Job]:
    """SUCCEEDED jobs of (namespace, kind) created after ``created_after``, oldest first."""
    after = None if created_after is None else (created_after, b"\xff" * 16)
    while True:
        rows = conn.execute(succeeded_jobs_query(ns_id, kind, after, JOB_PAGE)).all()
        for row in rows:
            yield Job.from_row(row)
        if len(rows) < JOB_PAGE:
            return
        after = (rows[-1].created_at, rows[-1].id)


def same_database(source: Engine, target: Engine) -> bool:
    """Whether ``target`` is the database ``source`` names, however it is spelled (host alias,
    socket, port forward): SQLite by file identity; MySQL/MariaDB by a named lock taken through
    ``source`` and seen as taken through ``target`` (same server), then the same schema."""
    if source.dialect.name != target.dialect.name:
        return False
    if source.dialect.name == "sqlite":
        return _sqlite_file(source) is not None and _sqlite_file(source) == _sqlite_file(target)
    if not is_mysql(source):
        return False
    name = f"orbit-restore-probe-{os.urandom(8).hex()}"
    with source.connect() as s:
        s.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": name})
        try:
            source_db = s.execute(text("SELECT DATABASE()")).scalar()
            with target.connect() as t:
                holder = t.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": name}).scalar()
                target_db = t.execute(text("SELECT DATABASE()")).scalar()
                folded = t.execute(text("SELECT @@lower_case_table_names")).scalar()
        finally:
            s.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": name})
            s.rollback()
    if holder is None or source_db is None or target_db is None:
        return False
    if folded:
        return str(source_db).lower() == str(target_db).lower()
    return str(source_db) == str(target_db)


def _sqlite_file(engine: Engine) -> tuple[int, int] | None:
    """(device, inode) of the main database file, None for an in-memory or not yet made file."""
    path = engine.url.database
    if not path or path == ":memory:":
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# --------------------------------------------------------------------------- target side


def strict_sessions(engine: Engine) -> None:
    """MySQL/MariaDB: every target session refuses to truncate or coerce a value (STRICT mode
    for all tables), so a value is stored exactly or the batch fails."""
    if not is_mysql(engine):
        return

    @event.listens_for(engine, "connect")
    def _strict(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("SET SESSION sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES')")
        cur.close()


def prepare_tables(engine: Engine, schema: SourceSchema) -> dict[str, Table]:
    """The target tables of ``schema``: created from the description when missing (with the
    primary key and, for the root, the keyset index), else checked (missing columns, other
    types, DATETIME without microseconds, extra NOT NULL columns: :class:`ConflictError`)."""
    metadata = MetaData()
    tables = {
        schema.root.name: sqlalchemy_table(
            schema.root, metadata, settled_column=schema.settled_column
        )
    }
    for spec, _parent in schema.children:
        tables[spec.name] = sqlalchemy_table(spec, metadata)
    with engine.connect() as conn:
        insp = inspect(conn)
        present = {spec.name: insp.get_columns(spec.name) for spec in schema.tables
                   if insp.has_table(spec.name)}  # fmt: skip
    for spec in schema.tables:
        if spec.name in present:
            problems = check_columns(spec, present[spec.name])
            if problems:
                raise ConflictError(
                    f"target table {spec.name} does not fit the archive: {'; '.join(problems)}"
                )
    missing = [tables[s.name] for s in schema.tables if s.name not in present]
    if missing:
        with engine.begin() as conn:
            metadata.create_all(conn, tables=missing, checkfirst=True)
    return tables


def existing_rows(
    conn: Connection,
    table: Table,
    spec: TableSpec,
    ns_id: bytes,
    link_column: str,
    keys: Sequence[bytes],
) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Target rows of the namespace whose ``link_column`` (the root's ``id``, a child's parent
    column) is one of ``keys``: primary key -> values in ``spec.names`` order. A primary-key
    prefix on the source tables."""
    if not keys:
        return {}
    q = existing_rows_query(table, spec, ns_id, link_column, keys)
    return {primary_key_at(spec, r): tuple(r) for r in conn.execute(q)}


def existing_rows_query(
    table: Table, spec: TableSpec, ns_id: bytes, link_column: str, keys: Sequence[bytes]
) -> Any:
    return select(*(table.c[name] for name in spec.names)).where(
        table.c.namespace_id == ns_id, table.c[link_column].in_(list(keys))
    )


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    if rows:
        conn.execute(table.insert(), list(rows))
