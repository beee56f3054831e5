"""Deployable Celery settings, read from the environment through orbit_tasks' one Settings object.

SPEC §7: explicit queue lists per worker, prefetch 1, late acks, results ignored, time limits
below the lease, task events on for Flower, no ETA/countdown (the database holds time).

Celery takes every public name of this module as a setting (``celery inspect conf`` shows them),
so everything that is not a setting is private: imports under ``_`` aliases, no ``__future__``
import (it would bind ``annotations``). tests/integration/test_celery_conf.py checks it.
"""

import socket as _socket
from datetime import timedelta as _timedelta
from pathlib import Path as _Path

from orbit_tasks.archive_limits import task_time_limits as _task_time_limits
from orbit_tasks.queues import CONTROL_QUEUE as _CONTROL
from orbit_tasks.queues import SENDER_QUEUE as _SENDER
from orbit_tasks.queues import is_amqp as _is_amqp
from orbit_tasks.settings import get_settings as _get_settings
from orbit_tasks.start_checks import beat_chains as _beat_chains

_settings = _get_settings()

broker_url = _settings.broker_url
if _settings.broker_is_filesystem:
    broker_transport_options = _settings.filesystem_broker_options()
    # kombu does not create these folders itself; a worker or publisher would crash on the first
    # message of a fresh checkout.
    for _key in ("data_folder_in", "processed_folder", "control_folder"):
        _Path(str(broker_transport_options[_key])).mkdir(parents=True, exist_ok=True)
else:
    # Below the shortest lease, so that a worker or beat on a blackholed network gets an error
    # from its own socket and reconnects, instead of sitting in recv() for the kernel's ~15
    # minutes of retransmissions while its main process can enforce no time limit
    # (docs/operations.md "Partitions and frozen nodes").
    _lease = min(_settings.archive_lease_seconds, _settings.sender_lease_seconds)
    _socket_seconds = max(2, min(10, _lease // 4))  # above BRPOP's 1 s server-side timeout
    _keepalive = {
        getattr(_socket, name): value
        for name, value in (
            ("TCP_KEEPIDLE", _socket_seconds),
            ("TCP_KEEPINTVL", 1),
            ("TCP_KEEPCNT", 3),
        )
        if hasattr(_socket, name)
    }
    broker_transport_options = {
        # Redis redelivers an unacked message after this; it must exceed the longest task run.
        "visibility_timeout": 2 * _settings.archive_lease_seconds + 60,
        "socket_timeout": _socket_seconds,
        "socket_connect_timeout": _socket_seconds,
        "socket_keepalive": True,
        "socket_keepalive_options": _keepalive,
        # kombu drops a BRPOP connection whose reply is this much overdue (the event loop sets
        # no socket timeout of its own).
        "health_check_interval": max(1, min(25, _lease // 4)),
    }
    broker_connection_timeout = _socket_seconds
    if _is_amqp(_settings.broker_url):
        # RabbitMQ (issue 30 item 2; docs/operations.md "Choosing a broker"): every orbit.*
        # queue a worker consumes or a wake-up is sent to is a durable quorum queue with a
        # delivery limit (celery_app.QuorumQueues); Celery then uses per-consumer QoS (quorum
        # queues have no global QoS). The socket options above are Redis's: AMQP notices a dead
        # peer by its heartbeat, here below the shortest lease like Redis's socket timeout.
        broker_transport_options = {}
        broker_heartbeat = max(5, _socket_seconds)
        task_default_queue_type = "quorum"
        task_create_missing_queue_type = "quorum"

task_ignore_result = True
result_backend = None
task_acks_late = True
task_reject_on_worker_lost = False  # a lost worker's job is recovered by its lease, not the broker
worker_prefetch_multiplier = 1
task_default_queue = _CONTROL
task_create_missing_queues = True
task_serializer = "json"
accept_content = ["json"]
worker_send_task_events = True
task_send_sent_event = True
worker_hijack_root_logger = False
broker_connection_retry_on_startup = True
# A worker cut off from the broker keeps retrying and serves again once the network heals, without
# a restart (the default gives up after 100 attempts).
broker_connection_max_retries = None
# ... at once and then every second, so the first progress after a Redis restart or a healed
# partition comes within one tick (orbit_tasks/broker_reconnect.py).
worker_consumer = "orbit_tasks.broker_reconnect:Consumer"
timezone = "UTC"
enable_utc = True

# Hard limit strictly below the archive lease so a stuck claim dies before another node may take
# it over; the soft limit leaves time to release cleanly (orbit_tasks/archive_limits.py).
task_time_limit, task_soft_time_limit = _task_time_limits(_settings.archive_lease_seconds)

task_routes = {
    "orbit.archive.tick": {"queue": _CONTROL},
    "orbit.sender.tick": {"queue": _SENDER},
    "orbit.sender.relay": {"queue": _SENDER},
    "orbit.sender.prune": {"queue": _SENDER},
}

# Beat schedules the ticks of the databases the environment names, as its schema check does
# (start_checks.beat_chains; issue 23): an archive-only deployment publishes no sender tick that
# nothing would consume (orbit.sender grew by ~43,000 messages a day), an outbox-only one no
# archive tick; with neither named, both (the embedded demo). docs/decisions.md.
_chains = _beat_chains()
# One beat leader (issue 30 item 3): several beats may run; the one holding the database lease
# publishes (orbit_tasks/beat/scheduler.py). A string: only beat imports it.
beat_scheduler = "orbit_tasks.beat.scheduler:LeaderScheduler"
beat_schedule = {}
if "platform" in _chains:
    beat_schedule["orbit-archive-tick"] = {
        "task": "orbit.archive.tick",
        "schedule": _timedelta(seconds=_settings.tick_seconds),
        "options": {"queue": _CONTROL, "expires": max(1, _settings.tick_seconds - 5)},
    }
if "business" in _chains:
    beat_schedule["orbit-sender-tick"] = {
        "task": "orbit.sender.tick",
        "schedule": _timedelta(seconds=_settings.sender_tick_seconds),
        "options": {
            "queue": _SENDER,
            "expires": max(1.0, _settings.sender_tick_seconds * 0.9),
        },
    }

# Retention of the outbox (docs/sender.md "Retention"): off unless ORBIT_SENDER_RETENTION is set.
# Hourly: each run scans the table once in keyset pages (no index on state in the seed).
_PRUNE_EVERY_SECONDS = 3600
if _settings.sender_retention_seconds is not None and "business" in _chains:
    beat_schedule["orbit-sender-prune"] = {
        "task": "orbit.sender.prune",
        "schedule": _timedelta(seconds=_PRUNE_EVERY_SECONDS),
        "options": {"queue": _SENDER, "expires": _PRUNE_EVERY_SECONDS - 60},
    }
