"""The Alembic environment of both chains (online with a given connection, or offline SQL): each
chain's ``env.py`` runs it (issue 26 item 4). Which chain is run is read from the version table.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import MetaData

from orbit_tasks.db import (
    collation,  # noqa: F401 - MariaDB collation mapping for CREATE TABLE
    history_tables,  # noqa: F401 - registers source tables on the metadata
)
from orbit_tasks.db.business_tables import metadata as business_metadata
from orbit_tasks.db.platform_tables import metadata as platform_metadata


def run() -> None:
    """Run the migrations Alembic asked for: the business chain when its version table is the
    sender's, else the platform chain."""
    config = context.config
    version_table = config.attributes.get("version_table", "alembic_version")
    target: MetaData = (
        business_metadata if version_table.startswith("sender") else platform_metadata
    )
    if context.is_offline_mode():
        context.configure(
            url=config.get_main_option("sqlalchemy.url"),
            target_metadata=target,
            literal_binds=True,
            version_table=version_table,
        )
    else:
        connection = config.attributes["connection"]
        context.configure(
            connection=connection, target_metadata=target, version_table=version_table
        )
    with context.begin_transaction():
        context.run_migrations()
