"""The worker's broker consumer, reconnecting at a short fixed pace (issue 14).

Celery's consumer reconnects through kombu's ``ensure_connection`` with its defaults: waits of
2, 4, 6 ... up to 30 s between attempts. After a Redis restart or a healed partition a worker
would then sit idle for up to 30 s with the broker back, several tick periods. Messages are
wake-ups and the database decides everything, so reconnecting often costs nothing but a log
line per attempt while the broker is away: this consumer retries at once, then every
:data:`RECONNECT_MAX_SECONDS`. Configured as ``worker_consumer`` in celeryconfig.py.
"""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

RECONNECT_MAX_SECONDS = 1.0


class Consumer(CeleryConsumer):
    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=0,
            interval_step=RECONNECT_MAX_SECONDS,
            interval_max=RECONNECT_MAX_SECONDS,
        )
        try:
            return super().ensure_connected(conn)
        finally:
            del conn.ensure_connection  # the method again
