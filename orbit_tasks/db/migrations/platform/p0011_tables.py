"""The platform tables of revision p0011, frozen (issue 29): the operator console's people and
their sessions.

A copy of ``orbit_console_users`` and ``orbit_console_sessions`` in
``orbit_tasks/db/platform_tables.py`` as they were when p0011 was written. Never edit this
file; a schema change is a new revision.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, Index, MetaData, PrimaryKeyConstraint, Table

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import ascii_str, datetime6, hex64, now6, varchar

REVISION = "p0011"

metadata = MetaData()

Table(
    "orbit_console_users",
    metadata,
    Column("name", varchar(64), nullable=False, comment="who signs in; named in audit rows"),
    Column("role", ascii_str(16), nullable=False, comment="viewer or operator"),
    Column("secret_hash", ascii_str(255), nullable=False, comment="scrypt; never the secret"),
    Column("created_by", varchar(128), nullable=False),
    Column("created_at", datetime6(), nullable=False, server_default=now6()),
    PrimaryKeyConstraint("name"),
    CheckConstraint("role IN ('viewer','operator')", name="ck_console_user_role"),
    comment="people of the operator console (orbit console user add)",
    **OPTS,
)

Table(
    "orbit_console_sessions",
    metadata,
    Column("session_sha256", hex64(), nullable=False, comment="SHA-256 of the cookie; never it"),
    Column("user_name", varchar(64), nullable=False),
    Column("created_at", datetime6(), nullable=False, server_default=now6()),
    Column("expires_at", datetime6(), nullable=False),
    PrimaryKeyConstraint("session_sha256"),
    Index("ix_console_session_user", "user_name", "expires_at"),
    comment="signed-in sessions of the operator console",
    **OPTS,
)
