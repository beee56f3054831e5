"""The sender wake-up published right after the application's transaction commits (issue 17).

``enqueue()`` calls :func:`wake_after_commit` on the caller's connection. Once that transaction
has **committed** (never before it, never inside it), one ``orbit.sender.relay`` message goes to
the ``orbit.sender`` queue, so a sender worker runs a pass at once instead of at the next tick.
A rolled-back transaction publishes nothing; several enqueues in one transaction publish one
message. Messages are wake-ups only (SPEC §7): a lost or duplicate one is harmless, the tick is
the fallback.

Why the dialect: SQLAlchemy has no after-commit event for a ``Connection``
(``ConnectionEvents.commit`` runs *before* the DBAPI commit, so a failing commit would already
have published; ``SessionEvents.after_commit`` exists for a ``Session`` only). Both a Session and
a Connection end their transaction in the engine dialect's ``do_commit``/``do_rollback`` (also
the pool's reset on check-in), so the first enqueue on an engine wraps those two methods of that
engine's dialect instance: the wrapper takes the connection's "wake pending" mark and publishes
only after the DBAPI ``commit()`` returned; a rollback (or a failed commit) drops the mark. The
mark lives in the DBAPI connection's ``info``, so it belongs to exactly one transaction.

Publishing is bounded (``ORBIT_SENDER_WAKE_TIMEOUT_SECONDS``, socket and connect timeouts, no
retry) and a failure (broker down) is one WARNING line ``sender.wakeup.after_commit_failed``;
for ``PUBLISH_BACKOFF_SECONDS`` after it no publish is tried, so a black-holed broker costs the
application one bounded wait, not one per commit. ``kombu`` is imported at the first publish:
it adds about 0.13 s to ``import orbit_tasks.sender`` (0.30 s without it), measured with
``python -X importtime``, and an application that never commits an enqueue never pays it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection, Dialect

from orbit_tasks.logs import log_action
from orbit_tasks.queues import SENDER_QUEUE
from orbit_tasks.settings import Settings, get_settings

logger = logging.getLogger("orbit.sender.wakeup")

RELAY_TASK = "orbit.sender.relay"
PENDING = "orbit.sender.wake_pending"  # key in the DBAPI connection's info
_WRAPPED = "_orbit_sender_wake_wrapped"  # attribute on a dialect instance
PUBLISH_BACKOFF_SECONDS = 5.0
# A wake-up waiting longer than this is dropped by the worker (the tick has covered it).
EXPIRES_SECONDS = 60.0
# On the embedded filesystem broker a wake-up nobody consumes stays a file for ever; with this
# many waiting, another adds nothing (a wake-up only says "run a pass") and is not written.
MAX_WAITING_FILE_WAKEUPS = 8

_install_lock = threading.Lock()


def wake_after_commit(conn: Connection, settings: Settings | None = None) -> None:
    """Publish one sender wake-up after the transaction ``conn`` is in commits (none if it rolls
    back). Off with ``ORBIT_SENDER_WAKE_ON_COMMIT=0``."""
    settings = settings or get_settings()
    if not settings.sender_wake_on_commit:
        return
    _wrap(conn.dialect)
    conn.info[PENDING] = settings


def _wrap(dialect: Dialect) -> None:
    if getattr(dialect, _WRAPPED, False):
        return
    with _install_lock:
        if getattr(dialect, _WRAPPED, False):
            return
        commit: Callable[[Any], None] = dialect.do_commit
        rollback: Callable[[Any], None] = dialect.do_rollback

        def do_commit(dbapi_connection: Any) -> None:
            settings = _take(dbapi_connection)
            commit(dbapi_connection)  # raises on a failed commit: nothing is published
            if settings is not None:
                PUBLISHER.wake(settings)

        def do_rollback(dbapi_connection: Any) -> None:
            _take(dbapi_connection)
            rollback(dbapi_connection)

        setattr(dialect, "do_commit", do_commit)  # noqa: B010 - an instance attribute
        setattr(dialect, "do_rollback", do_rollback)  # noqa: B010
        setattr(dialect, _WRAPPED, True)


def _take(dbapi_connection: Any) -> Settings | None:
    info = getattr(dbapi_connection, "info", None)
    if not isinstance(info, dict):
        return None
    found = info.pop(PENDING, None)
    return found if isinstance(found, Settings) else None


def wakeup_message(task_id: str, now: dt.datetime) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Celery's task message (protocol 2) for one ``orbit.sender.relay`` run: (body, headers,
    properties). Built here so that the application's process needs no Celery app."""
    headers = {
        "lang": "py",
        "task": RELAY_TASK,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": (now + dt.timedelta(seconds=EXPIRES_SECONDS)).isoformat(),
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "origin": f"{os.getpid()}@{socket.gethostname()}",
        "ignore_result": True,
    }
    body = [[], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    properties = {"correlation_id": task_id, "reply_to": ""}
    return body, headers, properties


class Publisher:
    """One broker connection per process (re-made after a fork or a failure), used by one
    publishing thread; every publish is bounded and tried once.

    A committing thread never publishes itself (issue 23 item 6): :meth:`wake` asks the
    publishing thread for a publish that starts after the commit, and waits for it at most
    ``ORBIT_SENDER_WAKE_TIMEOUT_SECONDS``. Commits that arrive while a publish is on its way share
    the next one, so a slow broker adds at most that bound to any commit, however many threads
    commit; a short-lived script still sees its wake-up published before its commit returns
    whenever the broker answers within the bound."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self._lock = threading.Lock()  # the connection and one publish at a time
        self._after_fork()
        self._pid = 0
        self._conn: Any = None
        self._producer: Any = None
        self._url = ""
        self._quiet_until = 0.0
        self.published = 0

    def _after_fork(self) -> None:
        self._cond = threading.Condition(threading.Lock())  # the generations below
        self._requested = 0  # publishes asked for (each commit needs one starting after it)
        self._started = 0  # the generation the running publish covers
        self._done = 0  # publishes finished (taken or failed)
        self._settings: Settings | None = None
        self._thread: threading.Thread | None = None
        self._thread_pid = 0

    def wake(self, settings: Settings) -> bool:
        """Ask for one wake-up after a commit; wait for it at most the wake-up timeout. True when
        it was published within that time."""
        deadline = self.monotonic() + settings.sender_wake_timeout_seconds
        with self._cond:
            if self.monotonic() < self._quiet_until:
                return False  # the broker failed a moment ago: no wait at all
            mine = self._started + 1  # a publish already on its way began before this commit
            self._requested = max(self._requested, mine)
            self._settings = settings
            self._ensure_thread()
            self._cond.notify_all()
            while self._done < mine:
                left = deadline - self.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self.monotonic() >= self._quiet_until

    def _ensure_thread(self) -> None:
        """The publishing thread of this process (a forked child starts its own)."""
        if self._thread is not None and self._thread_pid == os.getpid():
            return
        self._thread = threading.Thread(target=self._run, name="orbit-sender-wakeup", daemon=True)
        self._thread_pid = os.getpid()
        self._thread.start()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._requested <= self._done:
                    cond.wait()
                if cond is not self._cond:
                    return  # forked and reset: this thread belongs to the old state
                target, settings = self._requested, self._settings
                self._started = target
            assert settings is not None
            self.publish(settings)
            with cond:
                self._done = max(self._done, target)
                cond.notify_all()

    def publish(self, settings: Settings) -> bool:
        """Publish one wake-up now; False (and one log line) when the broker did not take it."""
        with self._lock:
            if self.monotonic() < self._quiet_until:
                return False
            try:
                if settings.broker_is_filesystem and _enough_waiting(settings):
                    return True  # nobody consumed the last ones: one more adds nothing
                producer = self._producer_for(settings)
                task_id = str(uuid.uuid4())
                body, headers, properties = wakeup_message(task_id, dt.datetime.now(dt.UTC))
                producer.publish(
                    body,
                    exchange="",
                    routing_key=SENDER_QUEUE,
                    headers=headers,
                    serializer="json",
                    retry=False,
                    timeout=settings.sender_wake_timeout_seconds,
                    **properties,
                )
            except Exception as exc:  # noqa: BLE001 - a lost wake-up waits for the tick
                self._close()
                self._quiet_until = self.monotonic() + PUBLISH_BACKOFF_SECONDS
                log_action(
                    logger,
                    "sender.wakeup.after_commit_failed",
                    logging.WARNING,
                    error=type(exc).__name__,
                    quiet_seconds=PUBLISH_BACKOFF_SECONDS,
                )
                return False
            self.published += 1
            return True

    def _producer_for(self, settings: Settings) -> Any:
        if (
            self._producer is not None
            and self._pid == os.getpid()
            and self._url == (settings.broker_url)
        ):
            return self._producer
        self._conn = self._producer = None  # a forked child never shares the parent's socket
        # Imported here: kombu and its Redis transport cost ~0.13 s (module docstring).
        from kombu import Connection as BrokerConnection
        from kombu import Producer

        timeout = settings.sender_wake_timeout_seconds
        if settings.broker_is_filesystem:
            options: dict[str, Any] = settings.filesystem_broker_options()
            for key in ("data_folder_in", "processed_folder", "control_folder"):
                Path(str(options[key])).mkdir(parents=True, exist_ok=True)  # as celeryconfig
        else:
            options = {
                "socket_timeout": timeout,
                "socket_connect_timeout": timeout,
                "max_retries": 0,
            }
        conn = BrokerConnection(
            settings.broker_url, connect_timeout=timeout, transport_options=options
        )
        conn.ensure_connection(max_retries=0, timeout=timeout)  # one try, no retry sleep
        self._conn, self._pid, self._url = conn, os.getpid(), settings.broker_url
        self._producer = Producer(conn.default_channel, auto_declare=False)
        return self._producer

    def _close(self) -> None:
        conn, self._conn, self._producer = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken; nothing to keep
                conn.release()

    def after_fork_in_child(self) -> None:
        """A forked child starts with a lock of its own and no connection: the parent's lock
        may have been held by a thread the child does not have (a publish in progress), and
        the parent's socket is not the child's to use or close."""
        self._lock = threading.Lock()
        self._after_fork()  # the parent's publishing thread is not the child's
        self._conn = self._producer = None
        self._pid = 0

    def reset(self) -> None:
        """Forget the connection and the quiet period (tests switch brokers)."""
        with self._lock:
            self._close()
            self._quiet_until = 0.0


def _enough_waiting(settings: Settings) -> bool:
    """Whether MAX_WAITING_FILE_WAKEUPS sender messages already wait in the filesystem broker's
    folder (kombu names them ``<ms>_<uuid>.<queue>.msg``)."""
    folder = Path(str(settings.filesystem_broker_options()["data_folder_in"]))
    suffix = f".{SENDER_QUEUE}.msg"
    waiting = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.endswith(suffix):
                    waiting += 1
                    if waiting >= MAX_WAITING_FILE_WAKEUPS:
                        return True
    except FileNotFoundError:
        return False
    return False


PUBLISHER = Publisher()


def _after_fork_in_child() -> None:
    global _install_lock
    _install_lock = threading.Lock()
    PUBLISHER.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
