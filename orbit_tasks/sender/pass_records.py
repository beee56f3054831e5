"""What a relay pass hands around (orbit_tasks/sender/relay.py): its counters, the rows it
owns, what a sending thread did with one, and the hand-off of those results to the pass's
thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from orbit_tasks.sender.client import SendResult
from orbit_tasks.sender.store.claims import Claimed


@dataclass
class PassStats:
    claimed: int = 0
    guarded: int = 0  # due rows moved to REVIEW by the claim guards
    swept: int = 0  # rows moved to REVIEW DEADLINE_EXCEEDED by the sweep
    results: dict[str, int] = field(default_factory=dict)
    identity_error: bool = False
    more: bool = False  # stopped by the pass budget with due rows left

    def add(self, result: str) -> None:
        self.results[result] = self.results.get(result, 0) + 1

    def as_fields(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "guarded": self.guarded,
            "swept": self.swept,
            "identity_error": self.identity_error,
            "more": self.more,
            **{f"n_{k}": v for k, v in sorted(self.results.items())},
        }


@dataclass(frozen=True)
class Owned:
    row: Claimed
    mono: float  # the monotonic seam, read just before the claim's database clock was read


@dataclass(frozen=True)
class Sent:
    """What a sending thread did with one claimed row; the pass's thread records it."""

    owned: Owned
    action: Literal["sent", "review", "release", "error"]
    code: str = ""  # the REVIEW code of action "review"
    reason: str = ""  # why a row was released unsent (logged)
    result: SendResult | None = None


class BatchRaced(Exception):
    """A one-statement claim or outcome write did not match every row it names (another sender
    changed one): roll back and do that step row by row."""


class Finished:
    """Results of the sending threads for the pass's thread, which is woken once enough of
    them are there (a page), not once per row."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Sent] = []
        self._want = 0

    def put(self, sent: Sent) -> None:
        with self._cond:
            self._items.append(sent)
            if self._want and len(self._items) >= self._want:
                self._cond.notify()

    def take(self, want: int) -> list[Sent]:
        """All results there are, after waiting until at least ``want`` are."""
        with self._cond:
            if want:
                self._want = want
                self._cond.wait_for(lambda: len(self._items) >= want)
                self._want = 0
            items, self._items = self._items, []
            return items
