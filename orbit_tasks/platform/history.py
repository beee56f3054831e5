"""The one declarative registry of history kinds (SPEC §3): kind -> root table, settled column,
children. Adding a kind is one entry here (plus its tables and the seed CHECK list)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table

from orbit_tasks.db import history_tables as h
from orbit_tasks.errors import InvalidInput


@dataclass(frozen=True)
class ChildSpec:
    table: Table
    parent_column: str


@dataclass(frozen=True)
class HistoryKind:
    name: str
    root: Table
    settled_column: str
    children: tuple[ChildSpec, ...] = ()

    @property
    def settled(self) -> Any:
        return self.root.c[self.settled_column]


HISTORY_KINDS: dict[str, HistoryKind] = {
    k.name: k
    for k in (
        HistoryKind("tasks", h.tasks, "finished_at", (ChildSpec(h.task_attempts, "task_id"),)),
        HistoryKind(
            "workflows", h.workflows, "closed_at", (ChildSpec(h.workflow_steps, "workflow_id"),)
        ),
        HistoryKind("events", h.events, "created_at"),
        HistoryKind("audit", h.audit_events, "created_at"),
        HistoryKind(
            "deliveries",
            h.deliveries,
            "finished_at",
            (ChildSpec(h.delivery_attempts, "delivery_id"),),
        ),
        HistoryKind("inbox", h.inbox_messages, "processed_at"),
        HistoryKind("idempotency", h.idempotency_records, "expires_at"),
    )
}


def history_kind(name: str) -> HistoryKind:
    try:
        return HISTORY_KINDS[name]
    except KeyError:
        allowed = ", ".join(HISTORY_KINDS)
        raise InvalidInput(f"kind {name!r} is not a history kind (allowed: {allowed})") from None


def source_table_names() -> list[str]:
    """Every table the archive reads history from: the root and child tables of every kind."""
    names: list[str] = []
    for hk in HISTORY_KINDS.values():
        names.append(hk.root.name)
        names.extend(c.table.name for c in hk.children)
    return names
