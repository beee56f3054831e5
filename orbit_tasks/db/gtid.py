"""Is a replica's executed GTID set contained in its primary's? Errant transactions (issue 24).

A transaction written on the replica itself *with* its binary log (an operator's fix, a
``mysql`` session that forgot ``sql_log_bin = 0``) leaves a GTID there that the primary never
wrote: the replica is no longer a copy of the primary. (A write with ``sql_log_bin = 0`` leaves no
GTID at all; the batch checksums of ``archive/store/source_check.py`` catch that one.)

MariaDB's GTIDs are ``domain-server-seq`` and a position lists one GTID per domain, so there is
no set arithmetic as in MySQL. What is compared (docs/decisions.md, "Errant GTIDs on MariaDB"):
the replica's ``@@gtid_binlog_state`` (the last sequence number per *domain and server* its
binary log holds: an errant transaction appears there with the replica's own server id and stays
there when later replicated transactions move ``@@gtid_current_pos`` past it) and its
``@@gtid_slave_pos``, against the primary's ``@@gtid_binlog_state`` and ``@@gtid_slave_pos``. A
replica GTID ``d-s-n`` is contained when the primary has a GTID ``d-s-m`` with ``m >= n``.
MySQL 8 has real GTID sets: ``GTID_SUBSET(replica's @@gtid_executed, @@gtid_executed)`` on the
primary.

The replica is read first, then the primary: the primary only moves forward, so a replica
applying the primary's writes between the two reads is never mistaken for a diverged one.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, text

from orbit_tasks.db.engine import is_mariadb

Position = dict[tuple[int, int], int]  # (domain, server) -> the highest sequence number


def parse_mariadb(*lists: str) -> Position:
    """The GTID lists (``0-1-100,1-2-5``, empty allowed) as the highest sequence number per
    (domain, server)."""
    out: Position = {}
    for gtids in lists:
        for item in gtids.replace("\n", "").split(","):
            item = item.strip()
            if not item:
                continue
            domain, server, seq = (int(part) for part in item.split("-"))
            out[(domain, server)] = max(out.get((domain, server), 0), seq)
    return out


def errant(replica: Position, primary: Position) -> list[str]:
    """The replica's GTIDs the primary's position does not contain, ``d-s-n`` (sorted)."""
    return [f"{d}-{s}-{n}" for (d, s), n in sorted(replica.items()) if primary.get((d, s), -1) < n]


def _mariadb_position(conn: Connection) -> Position:
    row = conn.execute(text("SELECT @@GLOBAL.gtid_binlog_state, @@GLOBAL.gtid_slave_pos")).one()
    return parse_mariadb(*(str(v or "") for v in row))


def errant_gtids(replica: Connection, primary: Connection) -> list[str]:
    """The replica's executed GTIDs its primary has not executed (empty: contained). The
    replica is read first (see the module's docstring)."""
    if is_mariadb(replica):
        theirs = _mariadb_position(replica)
        return errant(theirs, _mariadb_position(primary))
    executed = str(replica.execute(text("SELECT @@GLOBAL.gtid_executed")).scalar() or "")
    subset = primary.execute(
        text("SELECT GTID_SUBSET(:s, @@GLOBAL.gtid_executed)"), {"s": executed}
    ).scalar()
    if subset:
        return []
    missing = primary.execute(
        text("SELECT GTID_SUBTRACT(:s, @@GLOBAL.gtid_executed)"), {"s": executed}
    ).scalar()
    return [g.strip() for g in str(missing or "").replace("\n", "").split(",") if g.strip()]


def describe(gtids: Iterable[str], limit: int = 3) -> str:
    """At most ``limit`` GTIDs and how many more, for one line."""
    items = list(gtids)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
