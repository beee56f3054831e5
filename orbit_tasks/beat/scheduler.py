"""The scheduler of ``orbit beat`` (issue 30 item 3): Celery's persistent scheduler, publishing
only while this process holds the database lease of the beat leader.

Every beat process runs this loop: a leader renews its lease every quarter of it and publishes
the due ticks only while its lease is trusted (:func:`orbit_tasks.beat.rules.trusted_until`,
checked again right before each send); a standby looks at the lease every quarter of it and takes
it once it expired. A standby that takes over publishes its due ticks at once (its entries' last
runs are old), so ticks continue within one tick period of a leader's death or partition. A tick
sent by a deposed leader is harmless, as every tick is (SPEC §7: messages are wake-ups). Each
change is logged (``beat.leader.leading``, ``beat.leader.standby``, ``beat.leader.lost``)."""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import socket
import time
from collections.abc import Mapping
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry
from sqlalchemy import Engine

from orbit_tasks.beat import rules, store
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.logs import log_action
from orbit_tasks.settings import get_settings
from orbit_tasks.start_checks import beat_chains

log = logging.getLogger("orbit.beat.scheduler")


def _periods(beat_schedule: Mapping[str, Any]) -> list[float]:
    """The periods of the configured entries, in seconds (``celeryconfig.beat_schedule``: a
    timedelta or a number; crontab entries have none and are left out)."""
    out = []
    for entry in beat_schedule.values():
        every = entry.get("schedule")
        if isinstance(every, dt.timedelta):
            out.append(every.total_seconds())
        elif isinstance(every, int | float):
            out.append(float(every))
    return out


class LeaderScheduler(PersistentScheduler):
    """Celery's persistent scheduler behind the beat leader's lease (module docstring)."""

    #: The database engine and clock (tests may set the clock seam before the first tick).
    clock: Clock = DB_CLOCK

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.lease_id = secrets.token_bytes(16)
        self._engine: Engine | None = None
        self._trusted_until = 0.0  # monotonic: publish only before this
        self._next_look = 0.0
        self._leading = False
        self._said: str | None = None
        # The lease lives in the platform database; an outbox-only deployment (no platform
        # database named) has none to share, and runs exactly one beat (docs/operations.md).
        self.fenced = "platform" in beat_chains()
        super().__init__(*args, **kwargs)
        self.lease = rules.lease_seconds(
            _periods(self.app.conf.beat_schedule or {}), get_settings().beat_lease_seconds
        )

    # --- the lease -------------------------------------------------------------------------

    def _engine_now(self) -> Engine:
        if self._engine is None:
            # Imported here: the registry loads the database drivers, which Celery's own beat
            # import does not need before the first tick.
            from orbit_tasks.db.registry import beat_engine

            self._engine = beat_engine(self.lease)
        return self._engine

    def _look(self) -> None:
        """Take or renew the lease (a leader) or look whether it expired (a standby)."""
        sent_at = time.monotonic()
        try:
            with self._engine_now().begin() as conn:
                leads = store.take_or_renew(
                    conn, self.clock, holder=self.holder, lease_id=self.lease_id, lease=self.lease
                )
        except Exception as exc:  # noqa: BLE001 - any database failure: keep what is trusted
            log_action(
                log,
                "beat.leader.look_failed",
                logging.WARNING,
                holder=self.holder,
                error=type(exc).__name__,
                leading=self._publishing(),
            )
            self._say_state()
            return
        if leads:
            self._trusted_until = rules.trusted_until(sent_at, self.lease)
        else:
            self._trusted_until = 0.0
        self._say_state()

    def _publishing(self) -> bool:
        return time.monotonic() < self._trusted_until

    def _say_state(self) -> None:
        """Log each change: leading, standing by, or a lease lost while leading."""
        leading = self._publishing()
        if leading and self._said != "leading":
            log_action(
                log,
                "beat.leader.leading",
                holder=self.holder,
                lease_seconds=self.lease,
            )
            self._said = "leading"
        elif not leading and self._said != "standby":
            if self._said == "leading":
                log_action(log, "beat.leader.lost", logging.WARNING, holder=self.holder)
            else:
                with_leader = self._current_holder()
                log_action(
                    log,
                    "beat.leader.standby",
                    holder=self.holder,
                    leader=with_leader,
                    lease_seconds=self.lease,
                )
            self._said = "standby"

    def _current_holder(self) -> str | None:
        try:
            with self._engine_now().connect() as conn:
                row = store.read(conn, self.clock)
        except Exception:  # noqa: BLE001 - only for the log line
            return None
        return None if row is None else row.holder

    # --- Celery's loop -----------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self.fenced:
            if self._said is None:
                log_action(log, "beat.leader.unfenced", logging.WARNING, holder=self.holder)
                self._said = "unfenced"
            return float(super().tick(*args, **kwargs))
        now = time.monotonic()
        if now >= self._next_look:
            self._look()
            every = (
                rules.renew_every(self.lease)
                if self._publishing()
                else rules.watch_every(self.lease)
            )
            self._next_look = time.monotonic() + every
        until_look = max(0.05, self._next_look - time.monotonic())
        if not self._publishing():
            return until_look
        interval = float(super().tick(*args, **kwargs))
        return min(interval, until_look)

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Send a due tick only while the lease is trusted (checked right before the send), then
        record it fenced by the lease (the exporter's time since the last tick)."""
        if not self.fenced:
            super().apply_entry(entry, producer=producer)
            return
        if not self._publishing():
            return
        super().apply_entry(entry, producer=producer)
        try:
            with self._engine_now().begin() as conn:
                store.record_tick(conn, self.clock, lease_id=self.lease_id)
        except Exception as exc:  # noqa: BLE001 - the next look decides
            log_action(log, "beat.leader.record_failed", logging.WARNING, error=type(exc).__name__)

    def close(self) -> None:
        """A leader that stops hands its lease back, so a standby leads at its next look."""
        try:
            if self.fenced and self._publishing():
                with self._engine_now().begin() as conn:
                    store.resign(conn, self.clock, lease_id=self.lease_id)
                self._trusted_until = 0.0  # Celery may close twice: resign once
                log_action(log, "beat.leader.resigned", holder=self.holder)
        except Exception:  # noqa: BLE001 - the lease then expires by itself
            pass
        finally:
            super().close()
