"""Transactional outbox sender (SPEC §8): ``enqueue()`` inside the application's transaction, and a
relay that submits the frozen requests to the platform API with a frozen idempotency key."""

from orbit_tasks.sender.outbox import (
    InvalidRequest,
    OutboxConflict,
    OutboxEntry,
    OutboxRetry,
    enqueue,
    freeze_request,
)

__all__ = [
    "InvalidRequest",
    "OutboxConflict",
    "OutboxEntry",
    "OutboxRetry",
    "enqueue",
    "freeze_request",
]
