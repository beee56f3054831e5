"""What a relay pass hands around (orbit_tasks/sender/relay.py): its counters, the rows it
owns, what a sending thread did with one, and the hand-off of those results to the pass's
thread."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from orbit_tasks.sender.client import SendResult
from orbit_tasks.sender.policy import LastCode, ReleaseReason
from orbit_tasks.sender.store.claims import Claimed


class SendAction(enum.StrEnum):
    """What a sending thread did with one claimed row (its :class:`Sent`)."""

    SENT = "sent"  # POSTed: the result is classified and written
    REVIEW = "review"  # a check before sending found a REVIEW code
    RELEASE = "release"  # given back unsent (a :class:`ReleaseReason`)
    ERROR = "error"  # the thread failed: nothing is written, the lease runs out


class RowResult(enum.StrEnum):
    """What recording one row did: the pass's result labels (``n_<label>`` of
    ``sender.pass.done``, :attr:`PassStats.results`)."""

    ACCEPTED = "accepted"
    RETRY = "retry"
    REVIEW = "review"
    RELEASED = "released"
    STALE = "stale"  # a newer claim owns the row: the result was dropped
    ERROR = "error"


class Dropped(enum.StrEnum):
    """The ``outcome`` label of ``orbit_sender_sends_total`` for a POST whose result the fence
    dropped (a newer claim owned the row); every other POST is counted by its :class:`LastCode`."""

    STALE = "STALE"


SendOutcome = LastCode | Dropped


@dataclass
class PassStats:
    claimed: int = 0
    guarded: int = 0  # due rows moved to REVIEW by the claim guards
    swept: int = 0  # rows moved to REVIEW DEADLINE_EXCEEDED by the sweep
    results: dict[RowResult, int] = field(default_factory=dict)
    identity_error: bool = False
    more: bool = False  # stopped by the pass budget with due rows left

    def add(self, result: RowResult) -> None:
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
    action: SendAction
    code: LastCode | Literal[""] = ""  # the REVIEW code of action REVIEW
    reason: ReleaseReason | Literal[""] = ""  # why a row was released unsent (logged)
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
