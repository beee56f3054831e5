"""The keyset condition (orbit_tasks/db/keyset.py): the expanded form, never the row constructor,
and exactly the rows after the key (checked against Python's tuple order on SQLite)."""

from __future__ import annotations

import itertools

from sqlalchemy import Column, Integer, MetaData, Table, create_engine, insert, select
from sqlalchemy.dialects import mysql

from orbit_tasks.db.keyset import after_key

t = Table(
    "t", MetaData(), Column("a", Integer, primary_key=True), Column("b", Integer, primary_key=True)
)


def test_the_condition_is_the_expanded_form() -> None:
    sql = str(
        after_key((t.c.a, t.c.b), (1, 2)).compile(
            dialect=mysql.dialect(), compile_kwargs={"literal_binds": True}
        )
    )
    assert sql == "t.a > 1 OR t.a = 1 AND t.b > 2"


def test_the_rows_after_a_key_in_key_order() -> None:
    engine = create_engine("sqlite://")
    t.metadata.create_all(engine)
    keys = list(itertools.product(range(3), range(3)))
    with engine.begin() as conn:
        conn.execute(insert(t), [{"a": a, "b": b} for a, b in keys])
        for key in [(-1, 0), *keys, (1, -5), (1, 9)]:
            found = conn.execute(
                select(t.c.a, t.c.b).where(after_key((t.c.a, t.c.b), key)).order_by(t.c.a, t.c.b)
            ).all()
            assert [tuple(r) for r in found] == [k for k in keys if k > key], key
