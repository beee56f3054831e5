"""Errant GTIDs of a MariaDB replica against its primary (issue 24, db/gtid.py; pure)."""

from __future__ import annotations

from orbit_tasks.db.gtid import describe, errant, parse_mariadb


def test_positions_keep_the_highest_sequence_per_domain_and_server() -> None:
    assert parse_mariadb("0-1-100,1-2-5", "", "0-1-90, 0-3-4\n") == {
        (0, 1): 100,
        (1, 2): 5,
        (0, 3): 4,
    }
    assert parse_mariadb("", "") == {}


def test_a_replica_behind_or_equal_is_contained() -> None:
    primary = parse_mariadb("0-1-100,0-3-7", "")
    assert errant(parse_mariadb("", "0-1-99"), primary) == []
    assert errant(parse_mariadb("0-1-100", "0-1-100"), primary) == []
    assert errant(parse_mariadb("0-3-7", "0-1-50"), primary) == []  # an old primary's, kept


def test_a_local_write_with_binlog_is_errant_even_after_the_position_moved_past_it() -> None:
    """The replica's own server id in its binlog state stays there when replicated transactions
    move ``gtid_current_pos`` past it; the primary never wrote server 2's GTIDs."""
    primary = parse_mariadb("0-1-120", "")
    replica = parse_mariadb("0-2-101", "0-1-120")  # binlog state, slave pos
    assert errant(replica, primary) == ["0-2-101"]
    assert errant(parse_mariadb("0-1-121", ""), primary) == ["0-1-121"]  # ahead: not the primary's
    assert errant(parse_mariadb("5-1-1", ""), primary) == ["5-1-1"]  # a domain it never wrote


def test_describe_names_three_and_counts_the_rest() -> None:
    assert describe(["a", "b"]) == "a, b"
    assert describe(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"
