"""MariaDB lacks the MySQL 8 ``utf8mb4_0900_*`` collations (SPEC §2).

The schema is written with the MySQL 8 names, exactly as the seed DDL; when the DDL is compiled
for a MariaDB server the names are mapped here, in one place. Rendering for MySQL 8 (online or
offline) keeps ``0900``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable

MARIADB_COLLATIONS = {
    "utf8mb4_0900_as_cs": "utf8mb4_uca1400_as_cs",
    "utf8mb4_0900_bin": "utf8mb4_bin",
}


def map_collations_for_mariadb(ddl: str) -> str:
    for mysql_name, mariadb_name in MARIADB_COLLATIONS.items():
        ddl = ddl.replace(mysql_name, mariadb_name)
    return ddl


@compiles(CreateTable, "mysql")
@compiles(CreateTable, "mariadb")
def _create_table_mapped(element: CreateTable, compiler: Any, **kw: Any) -> str:
    ddl = compiler.visit_create_table(element, **kw)
    if getattr(compiler.dialect, "is_mariadb", False):
        ddl = map_collations_for_mariadb(ddl)
    return str(ddl)
