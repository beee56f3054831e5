"""Process-side counters and histograms of the workers (issue 17 item 5, docs/metrics.md).

What only the process that did it can know -- every POST of the relay and its outcome, how long
the exchange took, how late a row was accepted, an archive takeover, a stalled job -- is counted
here with ``prometheus_client``. With ``PROMETHEUS_MULTIPROC_DIR`` set (before the process
starts; prometheus_client reads it at import) every process, prefork children included, writes
its values to files in that directory and ``orbit metrics serve`` sums them (multiprocess mode).
Without it the values stay in the process and are not exported.

Everything the databases hold exactly (archived roots, bytes, files and claims per storage) is
read from them by the exporter instead (orbit_tasks/metrics/store.py), see docs/metrics.md.
"""

from __future__ import annotations

import os

from prometheus_client import Counter, Histogram

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
if os.environ.get(MULTIPROC_ENV):
    # prometheus_client opens its value files there as the metrics below are created: a missing
    # directory would stop every worker at import.
    os.makedirs(os.environ[MULTIPROC_ENV], exist_ok=True)

SENDS = Counter(
    "orbit_sender_sends",
    "POSTs of the outbox relay by outcome: the code the answer was classified as (ACCEPTED, "
    "TIMEOUT, UNAVAILABLE, ...), STALE when a newer claim owned the row",
    ["outcome"],
)
HTTP_SECONDS = Histogram(
    "orbit_sender_http_seconds",
    "Duration of one relay POST (connect to last body byte, or until it failed)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ACCEPT_LAG_SECONDS = Histogram(
    "orbit_sender_accept_lag_seconds",
    "Enqueue (created_at) to the ACCEPTED write, on the business database clock",
    buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
             3600.0, 21600.0, 86400.0),
)  # fmt: skip
ARCHIVE_TAKEOVERS = Counter(
    "orbit_archive_takeovers",
    "Archive claims of a RUNNING job whose lease had expired (a dead or frozen node's job)",
    ["storage"],
)
ARCHIVE_STALLS = Counter(
    "orbit_archive_stalls",
    "Archive jobs failed as STALLED at a takeover (too many takeovers without a new file)",
    ["storage"],
)
ARCHIVE_SCRUB_FAILURES = Counter(
    "orbit_archive_scrub_failures",
    "Scrubs of a SUCCEEDED archive job whose chain did not verify from its storage (issue 28)",
    ["storage"],
)
ARCHIVE_SCRUB_BYTES = Counter(
    "orbit_archive_scrub_read_bytes",
    "Bytes the scheduled scrub read back from a storage (its rate: ORBIT_ARCHIVE_SCRUB_BYTES_"
    "PER_SECOND)",
    ["storage"],
)

# The families a scrape of `orbit metrics serve` carries from these (counters get `_total`).
FAMILIES = (
    "orbit_sender_sends_total",
    "orbit_sender_http_seconds",
    "orbit_sender_accept_lag_seconds",
    "orbit_archive_takeovers_total",
    "orbit_archive_stalls_total",
    "orbit_archive_scrub_failures_total",
    "orbit_archive_scrub_read_bytes_total",
)


def multiprocess_dir() -> str | None:
    """The directory the workers write their values to (None: not exported)."""
    return os.environ.get(MULTIPROC_ENV) or None
