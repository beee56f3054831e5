"""Celery tasks of the outbox sender — thin wrappers around :class:`Relay` and the retention.

``orbit.sender.tick`` (beat, every ``ORBIT_SENDER_TICK_SECONDS``) runs one bounded relay pass; when
the pass stops with due rows left it publishes one ``orbit.sender.relay`` wake-up so that another
sender worker joins in. Messages are wake-ups only: ownership is the database claim.
``orbit.sender.prune`` (beat, hourly, only with ``ORBIT_SENDER_RETENTION``) runs ``orbit sender
prune --older-than $ORBIT_SENDER_RETENTION`` for at most one claim budget and hands the rest of
the table to a continuation of itself (docs/sender.md "Retention").
"""

from __future__ import annotations

import logging
import threading

from orbit_tasks.celery_app import app
from orbit_tasks.db.faults import driver_code, is_transient_db
from orbit_tasks.db.registry import business_engine
from orbit_tasks.errors import TransientError
from orbit_tasks.logs import log_action
from orbit_tasks.sender import retention
from orbit_tasks.sender.client import PlatformClient
from orbit_tasks.sender.relay import PassStats, Relay
from orbit_tasks.sender.wakeup import RELAY_TASK
from orbit_tasks.sender_limits import pass_limits
from orbit_tasks.settings import get_settings

logger = logging.getLogger("orbit.sender.tasks")
_lock = threading.Lock()
_relay: Relay | None = None

# Claim budget, HTTP bound and Celery limits derived together from the lease, so that a pass
# always ends on its own before the soft limit (orbit_tasks/sender_limits.py, docs/sender.md).
LIMITS = pass_limits(
    get_settings().sender_lease_seconds, get_settings().sender_http_timeout_seconds
)


def get_relay() -> Relay:
    """The process's relay (one HTTP client and identity cache per worker process)."""
    global _relay
    with _lock:
        if _relay is None:
            s = get_settings()
            client = PlatformClient(
                s.api_url,
                s.api_token,
                timeout_seconds=s.sender_http_timeout_seconds,
                max_connections=s.sender_concurrency,
            )
            _relay = Relay(
                business_engine(),
                client,
                lease_seconds=s.sender_lease_seconds,
                timeout_seconds=s.sender_http_timeout_seconds,
                concurrency=s.sender_concurrency,
            )
        return _relay


def _run(failed_action: str) -> PassStats:
    """One pass. The business database down or busy is one WARNING line (``failed_action``, the
    error type and driver code, no traceback) and :class:`TransientError`, which the tasks
    declare as expected (``throws``): Celery logs it at INFO without a traceback. The next tick
    retries; rows are owned by their database claims, so nothing is lost."""
    try:
        return get_relay().run_pass(budget_seconds=LIMITS.claim_seconds)
    except Exception as exc:
        if not is_transient_db(exc):
            raise
        log_action(
            logger, failed_action, logging.WARNING, error=type(exc).__name__, code=driver_code(exc)
        )
        raise TransientError(
            "business database unavailable or busy; the next tick retries"
        ) from None


@app.task(
    name="orbit.sender.tick",
    ignore_result=True,
    throws=(TransientError,),
    acks_late=True,
    soft_time_limit=LIMITS.soft_limit_seconds,
    time_limit=LIMITS.hard_limit_seconds,
)
def tick() -> dict[str, object]:
    """One bounded relay pass (no ETA: the database's ``wake_at`` holds every time)."""
    stats = _run("sender.tick.failed")
    if stats.more:
        try:
            relay_task.apply_async(queue="orbit.sender")
        except Exception as exc:  # noqa: BLE001 - a lost wake-up only waits for the next tick
            log_action(
                logger, "sender.wakeup.publish_failed", logging.WARNING, error=type(exc).__name__
            )
    return stats.as_fields()


@app.task(
    name=RELAY_TASK,
    ignore_result=True,
    throws=(TransientError,),
    acks_late=True,
    soft_time_limit=LIMITS.soft_limit_seconds,
    time_limit=LIMITS.hard_limit_seconds,
)
def relay_task() -> dict[str, object]:
    """The same bounded pass, published by a tick that left due rows behind."""
    return _run("sender.relay.failed").as_fields()


@app.task(
    name="orbit.sender.prune",
    ignore_result=True,
    throws=(TransientError,),
    acks_late=True,
    soft_time_limit=LIMITS.soft_limit_seconds,
    time_limit=LIMITS.hard_limit_seconds,
)
def prune_task(after: str | None = None) -> dict[str, object]:
    """Prune outbox rows older than ``ORBIT_SENDER_RETENTION`` (off: nothing), from the cursor
    ``after`` (``NS:OP``) for at most the claim budget; a continuation takes the rest."""
    seconds = get_settings().sender_retention_seconds
    if seconds is None:
        log_action(logger, "sender.prune.off", reason="ORBIT_SENDER_RETENTION is off")
        return {"pruned": 0}
    cursor = None
    if after:
        ns, _, op = after.partition(":")
        cursor = (ns, op)
    try:
        report = retention.prune(
            business_engine(),
            older_than_seconds=seconds,
            after=cursor,
            budget_seconds=LIMITS.claim_seconds,
        )
    except Exception as exc:
        if not is_transient_db(exc):
            raise
        log_action(
            logger,
            "sender.prune.failed",
            logging.WARNING,
            error=type(exc).__name__,
            code=driver_code(exc),
        )
        raise TransientError(
            "business database unavailable or busy; the next prune retries"
        ) from None
    fields = report.as_fields()
    if report.next_after is not None:
        try:
            prune_task.apply_async(args=[fields["next"]], queue="orbit.sender")
        except Exception as exc:  # noqa: BLE001 - the next beat run starts over
            log_action(
                logger, "sender.prune.publish_failed", logging.WARNING, error=type(exc).__name__
            )
    return fields
