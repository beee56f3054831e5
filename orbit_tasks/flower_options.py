"""Pure decisions behind ``orbit flower`` (SPEC §12 "Flower"): who may start it without
authentication, and how much task history it keeps. No I/O; the command is ``cli/flower.py``.
"""

from __future__ import annotations

import ipaddress
import math

from orbit_tasks.errors import InvalidInput

DAY_SECONDS = 86_400
# Archive tasks (run_job wake-ups and continuations) a day of history keeps room for besides the
# ticks: a busy fleet publishes a few per job per tick period (sweeps, one continuation per
# time slice). Operators with more raise --max-tasks.
ARCHIVE_TASKS_PER_DAY = 50_000
HISTORY_ROUNDING = 10_000
# The tasks page shows the argsrepr labels (kind, namespace, storage, job) next to the name.
TASKS_COLUMNS = "name,uuid,state,args,received,runtime,worker"
# Offline workers (a restarted node comes back under a new pid-based name) leave the workers
# page after a day.
PURGE_OFFLINE_WORKERS_SECONDS = DAY_SECONDS


def is_loopback(address: str) -> bool:
    """True for ``localhost`` and loopback IPs (127.0.0.0/8, ::1); the empty address and
    0.0.0.0 bind every interface."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        raise InvalidInput(
            f"--address {address!r} is not an IP address or 'localhost' "
            "(allowed: an IPv4/IPv6 address of this host)"
        ) from None


def require_auth(address: str, no_auth: bool, users: int) -> bool:
    """Whether Flower runs with basic auth. Raises InvalidInput (exit 2) when it may not start:
    no ``ORBIT_FLOWER_BASIC_AUTH`` without ``--no-auth``, or ``--no-auth`` off loopback."""
    loopback = is_loopback(address)
    if no_auth:
        if not loopback:
            raise InvalidInput(
                f"--no-auth is refused with --address {address} (allowed only with a loopback "
                "address: 127.0.0.1, ::1 or localhost)"
            )
        return False
    if users == 0:
        raise InvalidInput(
            "ORBIT_FLOWER_BASIC_AUTH is not set (required: user:password[,user:password]; "
            "or --no-auth with a loopback address)"
        )
    return True


def task_history_size(
    sender_tick_seconds: int,
    archive_tick_seconds: int,
    archive_tasks_per_day: int = ARCHIVE_TASKS_PER_DAY,
) -> int:
    """Flower's ``max_tasks`` (an LRU of tasks): a day of sender ticks plus at most one relay
    wake-up per tick, a day of archive ticks, and room for a day of archive job tasks, rounded
    up. Defaults (2 s, 60 s): 43,200 + 43,200 + 1,440 + 50,000 = 137,840 -> 140,000."""
    if sender_tick_seconds < 1 or archive_tick_seconds < 1 or archive_tasks_per_day < 0:
        raise ValueError("tick periods must be >= 1 s and the archive allowance >= 0")
    sender = 2 * math.ceil(DAY_SECONDS / sender_tick_seconds)
    archive_ticks = math.ceil(DAY_SECONDS / archive_tick_seconds)
    total = sender + archive_ticks + archive_tasks_per_day
    return math.ceil(total / HISTORY_ROUNDING) * HISTORY_ROUNDING
