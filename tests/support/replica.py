"""A private MariaDB primary and its replica (issue 16 item 4): two ``mariadbd`` of the test's own
(:class:`~tests.support.mariadb_server.PrivateMariaDB`), binary-log replication with GTIDs
(``MASTER_USE_GTID=slave_pos``), started and removed by a test fixture.

The machine's shared MariaDB has no binary log and is no one's primary, so the replica tests do
not use it: the primary here gets ``--log-bin`` and ``--server-id=1``, the replica
``--server-id=2`` (and a binary log of its own, as a replica that may be promoted has).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, text

from tests.support.mariadb_server import PrivateMariaDB


class ReplicaPair:
    def __init__(self) -> None:
        self.primary = PrivateMariaDB(
            extra=("--server-id=1", "--log-bin=primary-bin", "--binlog-format=ROW")
        )
        self.replica = PrivateMariaDB(extra=("--server-id=2", "--log-bin=replica-bin"))
        self._primary_admin: Engine | None = None
        self._replica_admin: Engine | None = None

    @property
    def primary_admin(self) -> Engine:
        assert self._primary_admin is not None
        return self._primary_admin

    @property
    def replica_admin(self) -> Engine:
        assert self._replica_admin is not None
        return self._replica_admin

    def start(self) -> None:
        self.primary.start()
        self.replica.start()
        self._primary_admin = self.primary.admin()
        self._replica_admin = self.replica.admin()
        with self.replica_admin.connect() as conn:
            conn.execute(
                text(
                    "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', "
                    f"MASTER_PORT = {self.primary.port}, MASTER_USER = 'root', "
                    "MASTER_CONNECT_RETRY = 1, MASTER_USE_GTID = slave_pos"
                )
            )
            conn.execute(text("START SLAVE"))
        self.wait_caught_up()

    def remove(self) -> None:
        for engine in (self._primary_admin, self._replica_admin):
            if engine is not None:
                engine.dispose()
        self.replica.remove()
        self.primary.remove()

    def wait_caught_up(self, timeout: int = 60) -> None:
        """Until the replica has applied every transaction the primary has logged."""
        with self.primary_admin.connect() as conn:
            pos = conn.execute(text("SELECT @@gtid_binlog_pos")).scalar_one()
        with self.replica_admin.connect() as conn:
            got = conn.execute(
                text("SELECT MASTER_GTID_WAIT(:pos, :t)"), {"pos": pos, "t": timeout}
            ).scalar_one()
        assert got == 0, f"the replica did not reach {pos} in {timeout} s: {self.status()}"

    def status(self) -> dict[str, object]:
        with self.replica_admin.connect() as conn:
            row = conn.execute(text("SHOW SLAVE STATUS")).mappings().first()
        return {} if row is None else dict(row)

    def stop_sql_thread(self) -> None:
        with self.replica_admin.connect() as conn:
            conn.execute(text("STOP SLAVE SQL_THREAD"))

    def start_sql_thread(self) -> None:
        with self.replica_admin.connect() as conn:
            conn.execute(text("START SLAVE SQL_THREAD"))

    def replica_local(self, database: str, *statements: str) -> None:
        """Statements run on the replica alone (``sql_log_bin = 0``): a local difference. The
        pooled connection gets its binary log back afterwards (a later statement on it, such as
        an errant transaction a test means to log, is logged)."""
        with self.replica_admin.connect() as conn:
            conn.execute(text("SET SESSION sql_log_bin = 0"))
            try:
                conn.execute(text(f"USE `{database}`"))
                for statement in statements:
                    conn.execute(text(statement))
            finally:
                conn.execute(text("SET SESSION sql_log_bin = 1"))

    @contextmanager
    def database(self, prefix: str = "orbit_r") -> Iterator[tuple[str, str]]:
        """A new database created on the primary (and so on the replica); yields the
        (primary URL, replica URL) of it and drops it afterwards (on both)."""
        name = f"{prefix}_{secrets.token_hex(5)}"
        with self.primary_admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        self.wait_caught_up()
        try:
            yield self.primary.url(name), self.replica.url(name)
        finally:
            self.start_sql_thread()  # idempotent: a test may have stopped it
            with self.primary_admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
            self.wait_caught_up()


@contextmanager
def replica_pair() -> Iterator[ReplicaPair]:
    pair = ReplicaPair()
    try:
        pair.start()
        yield pair
    finally:
        pair.remove()
