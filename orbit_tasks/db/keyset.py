"""The keyset condition of a page after a two-column key, in the expanded form
``a > :a OR (a = :a AND b > :b)``, never the row constructor ``(a, b) > (:a, :b)`` (17x slower
on MariaDB 10.11; docs/design.md). Builds an expression, runs nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, or_
from sqlalchemy.sql.elements import ColumnElement


def after_key(columns: tuple[Any, Any], key: tuple[Any, Any]) -> ColumnElement[bool]:
    """Rows whose ``columns`` come after ``key`` in (first, second) order."""
    (first, second), (first_at, second_at) = columns, key
    return or_(first > first_at, and_(first == first_at, second > second_at))
