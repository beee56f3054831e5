"""The worker's warm shutdown as one flag its pool children see (issue 30 item 1, rolling
restarts; docs/operations.md "Rolling restarts").

Celery's first SIGTERM (warm shutdown) reaches only the worker's main process: it stops
consuming and waits for the running tasks. The main process sets this flag
(``celery_app``'s ``worker_shutting_down`` handler); a claim chain of the runner and a relay pass
read it at their next boundary and hand their work back at once, as if their time slice were
over: the archive claim confirms the file in hand, releases the job to PENDING and publishes a
continuation; the relay stops claiming, finishes the sends in flight and releases the rows not
sent yet.

The flag lives in one byte of anonymous shared memory mapped when this module is first
imported, in the main process (the Celery app imports it) before the pool forks its children:
every child -- also one forked later -- reads the same byte. No signal reaches a child.
"""

from __future__ import annotations

import mmap

_FLAG = mmap.mmap(-1, 1)  # MAP_SHARED | MAP_ANONYMOUS: shared with every child forked later


def begin() -> bool:
    """Set the flag (the main process, on the first SIGTERM). Returns whether it was already
    set: a second SIGTERM."""
    already = _FLAG[0] == 1
    _FLAG[0] = 1
    return already


def requested() -> bool:
    """Whether this worker is shutting down (any process of it)."""
    return _FLAG[0] == 1


def reset() -> None:
    """Clear the flag (tests that run the runner in their own process)."""
    _FLAG[0] = 0
