"""History generator for demos, tests and benchmarks (``orbit dev seed-history``).

Row generation is pure: it takes a ``random.Random`` and the database clock ``now`` and yields
chunks of rows; :func:`insert_chunk` is the thin bulk insert (``executemany`` per table).

What the rows look like, for every kind:

- *settled* roots (a share ``settled_fraction``) have their settled column set to a time spread
  over the last ``days`` days (with microseconds, at least one hour ago). *Unsettled* roots have
  the settled column NULL; for the kinds whose settled column is NOT NULL (events and audit:
  ``created_at``; idempotency: ``expires_at``) "unsettled" means too recent for any retention
  policy (created less than one hour ago) or not yet expired (``expires_at`` in the future).
- ids are UUIDv7 whose timestamp is the settled time (the created time for unsettled roots), so
  (settled, id) order stays close to primary-key order; ``random_ids`` gives 16 random bytes.
- children (task attempts, workflow steps, delivery attempts): exactly ``children`` per settled
  root, 0..``children`` per unsettled root, all finished for settled roots.
- JSON payloads are text with exact decimals (``"amount":12345678901234567890.123456789``, which
  no float can hold) and 4-byte UTF-8 (emoji, musical symbols).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, insert
from sqlalchemy.exc import IntegrityError

from orbit_tasks.errors import ConflictError, InvalidInput
from orbit_tasks.platform.history import HISTORY_KINDS, HistoryKind, history_kind
from orbit_tasks.timestamps import format_ts

CHUNK_ROOTS = 2000
MAX_ROOTS = 10_000_000
MAX_CHILDREN = 100
MAX_DAYS = 3650
DEFAULT_CHILDREN = 2
IDEMPOTENCY_RETENTION = timedelta(hours=72)

_SECOND_US = 1_000_000
_HOUR_US = 3600 * _SECOND_US
_DAY_US = 24 * _HOUR_US
_EPOCH = datetime(1970, 1, 1)

# Texts with 4-byte UTF-8 (emoji, U+1D11E musical symbol), accents, CJK, RTL, escapes.
MEMOS = (
    "café ☕ order",
    "rocket launch 🚀✨",
    "music 𝄞 sheet",
    "日本語のメモ",
    "Ελληνικά και 😀",
    "مرحبا بالعالم",
    'quote " and \\ backslash',
    "line one\nline two",
    "family 👨‍👩‍👧 emoji",
    "plain ascii memo",
)


@dataclass(frozen=True)
class SeedSpec:
    """A validated request of ``orbit dev seed-history``."""

    kind: str
    roots: int
    children: int
    days: int
    random_ids: bool = False
    settled_fraction: float = 0.8


@dataclass
class Chunk:
    """Rows of up to ``CHUNK_ROOTS`` roots and their children."""

    roots: list[dict[str, Any]] = field(default_factory=list)
    children: list[dict[str, Any]] = field(default_factory=list)
    settled: int = 0


@dataclass(frozen=True)
class SeedResult:
    kind: str
    table: str
    roots: int
    settled: int
    unsettled: int
    children: dict[str, int]


def make_spec(
    kind: str,
    roots: int,
    children: int | None = None,
    days: int = 30,
    random_ids: bool = False,
    settled_fraction: float = 0.8,
) -> SeedSpec:
    """Validate the generator options (messages name the value and the allowed range)."""
    hk = history_kind(kind)
    if not 1 <= roots <= MAX_ROOTS:
        raise InvalidInput(f"--roots {roots} is out of range (allowed 1..{MAX_ROOTS})")
    if children is None:
        children = DEFAULT_CHILDREN if hk.children else 0
    if not hk.children and children != 0:
        raise InvalidInput(f"kind {kind!r} has no child table (allowed --children 0)")
    if not 0 <= children <= MAX_CHILDREN:
        raise InvalidInput(f"--children {children} is out of range (allowed 0..{MAX_CHILDREN})")
    if not 1 <= days <= MAX_DAYS:
        raise InvalidInput(f"--days {days} is out of range (allowed 1..{MAX_DAYS})")
    if not 0.0 <= settled_fraction <= 1.0:
        raise InvalidInput(
            f"--settled-fraction {settled_fraction} is out of range (allowed 0.0..1.0)"
        )
    return SeedSpec(kind, roots, children, days, random_ids, settled_fraction)


def unix_ms(ts: datetime) -> int:
    return (ts - _EPOCH) // timedelta(milliseconds=1)


def uuid7_from(rng: random.Random, ms: int) -> bytes:
    """A UUIDv7 (RFC 9562 layout) with timestamp ``ms`` and random bits from ``rng``."""
    rand = bytearray(rng.randbytes(10))
    rand[0] = 0x70 | (rand[0] & 0x0F)
    rand[2] = 0x80 | (rand[2] & 0x3F)
    return ms.to_bytes(6, "big") + bytes(rand)


def exact_decimal(rng: random.Random) -> str:
    """A decimal literal with 29 significant digits (float would round it)."""
    return f"{rng.randrange(10**19, 10**20)}.{rng.randrange(10**9):09d}"


def json_text(obj: dict[str, Any], decimals: dict[str, str]) -> str:
    """Compact JSON text of ``obj`` plus number members written verbatim (exact decimals)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    if not decimals:
        return text
    extra = ",".join(f"{json.dumps(k)}:{v}" for k, v in decimals.items())
    return text[:-1] + ("," if obj else "") + extra + "}"


def iso(ts: datetime) -> str:
    return format_ts(ts)


class _Gen:
    """Per-run state: the random source, the clock, the spec and a running counter."""

    def __init__(
        self,
        spec: SeedSpec,
        ns_id: bytes,
        queue_ids: list[bytes],
        rng: random.Random,
        now: datetime,
    ) -> None:
        self.spec, self.ns_id, self.queue_ids, self.rng, self.now = (
            spec,
            ns_id,
            queue_ids,
            rng,
            now,
        )
        self.n = 0

    # --- time and ids ----------------------------------------------------------------------

    def ago(self, lo_us: int, hi_us: int) -> datetime:
        return self.now - timedelta(microseconds=self.rng.randrange(lo_us, max(hi_us, lo_us + 1)))

    def settled_time(self) -> datetime:
        """At least one hour ago, at most ``days`` ago (so no policy >= 1 h excludes it all)."""
        return self.ago(_HOUR_US, self.spec.days * _DAY_US)

    def recent_time(self, limit_us: int) -> datetime:
        return self.ago(0, min(limit_us, self.spec.days * _DAY_US))

    def dur(self, lo_ms: int, hi_ms: int) -> timedelta:
        return timedelta(microseconds=self.rng.randrange(lo_ms * 1000, hi_ms * 1000))

    def root_id(self, ts: datetime) -> bytes:
        if self.spec.random_ids:
            return self.rng.randbytes(16)
        return uuid7_from(self.rng, unix_ms(ts))

    def spans(self, start: datetime, end: datetime, k: int) -> list[tuple[datetime, datetime]]:
        """``k`` consecutive sub-intervals of [start, end] (random cut points)."""
        total = max(int((end - start) / timedelta(microseconds=1)), 0)
        cuts = sorted(self.rng.randrange(total + 1) for _ in range(2 * k - 2))
        points = [0, *cuts, total]
        return [
            (
                start + timedelta(microseconds=points[2 * i]),
                start + timedelta(microseconds=points[2 * i + 1]),
            )
            for i in range(k)
        ]

    def memo(self) -> str:
        return self.rng.choice(MEMOS)

    def payload(self, kind: str, **extra: Any) -> str:
        self.n += 1
        obj = {"kind": kind, "seq": self.n, "memo": self.memo(), **extra}
        return json_text(obj, {"amount": exact_decimal(self.rng), "fee": "0.10"})

    def child_count(self, settled: bool) -> int:
        k = self.spec.children
        return k if settled else self.rng.randint(0, k)

    # --- one root (and its children) per kind -----------------------------------------------

    def tasks(self, settled: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rng, k = self.rng, self.child_count(settled)
        finished: datetime | None
        started: datetime | None
        if settled:
            ts = self.settled_time()
            finished, started = ts, ts - self.dur(50, 600_000)
            created = started - self.dur(1, 300_000)
            state = rng.choices(("SUCCEEDED", "FAILED", "CANCELLED"), (80, 15, 5))[0]
        else:
            created = self.recent_time(_DAY_US)
            finished = None
            state = "RUNNING" if k else "PENDING"
            started = min(created + self.dur(1, 60_000), self.now) if k else None
            ts = created
        rid = self.root_id(ts)
        error = rng.choice(("HANDLER_ERROR", "TIMEOUT", "WORKER_LOST")) if state == "FAILED" else ""
        root = {
            "namespace_id": self.ns_id,
            "id": rid,
            "queue_id": rng.choice(self.queue_ids),
            "state": state,
            "idempotency_key": f"op-{rid.hex()}" if rng.random() < 0.7 else None,
            "request_json": self.payload("task", type="payment.capture", items=rng.randint(1, 9)),
            "result_json": (
                json_text({"ok": True, "note": self.memo()}, {"total": exact_decimal(rng)})
                if state == "SUCCEEDED"
                else None
            ),
            "error_code": error,
            "attempts": k,
            "created_at": created,
            "started_at": started,
            "finished_at": finished,
        }
        children = []
        if k and started is not None:
            end = finished or self.now
            for i, (s, e) in enumerate(self.spans(started, end, k), start=1):
                last = i == k
                children.append(
                    {
                        "namespace_id": self.ns_id,
                        "task_id": rid,
                        "attempt_no": i,
                        "state": (state if settled else "RUNNING") if last else "FAILED",
                        "worker": f"celery@worker-{rng.randint(1, 8)}",
                        "error_code": (error if last else "WORKER_LOST"),
                        "started_at": s,
                        "finished_at": e if (settled or not last) else None,
                    }
                )
        return root, children

    def workflows(self, settled: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rng, k = self.rng, self.child_count(settled)
        closed: datetime | None
        if settled:
            ts = closed = self.settled_time()
            created = closed - self.dur(1000, 7_200_000)
            state = rng.choices(("COMPLETED", "FAILED", "CANCELLED"), (85, 10, 5))[0]
        else:
            created = self.recent_time(_DAY_US)
            closed, state, ts = None, "RUNNING", created
        rid = self.root_id(ts)
        root = {
            "namespace_id": self.ns_id,
            "id": rid,
            "name": rng.choice(("order-fulfilment", "refund", "onboarding", "nightly-report")),
            "state": state,
            "input_json": self.payload("workflow", customer=f"cus-{rng.randrange(10**6)}"),
            "created_at": created,
            "closed_at": closed,
        }
        steps = ("validate", "reserve-stock", "charge", "ship", "notify")
        children = []
        for i, (s, e) in enumerate(self.spans(created, closed or self.now, k), start=1):
            last = i == k
            if settled:
                st = "FAILED" if (last and state == "FAILED") else "COMPLETED"
            else:
                st = "RUNNING" if last else "COMPLETED"
            done = st != "RUNNING"
            children.append(
                {
                    "namespace_id": self.ns_id,
                    "workflow_id": rid,
                    "step_no": i,
                    "name": steps[(i - 1) % len(steps)],
                    "state": st,
                    "task_id": uuid7_from(rng, unix_ms(s)) if rng.random() < 0.8 else None,
                    "output_json": (
                        json_text({"step": i, "memo": self.memo()}, {"value": exact_decimal(rng)})
                        if st == "COMPLETED"
                        else None
                    ),
                    "started_at": s,
                    "finished_at": e if done else None,
                }
            )
        return root, children

    def _flat_time(self, settled: bool) -> datetime:
        """Settled column NOT NULL: settled = older than 1 h; unsettled = the last hour."""
        return self.settled_time() if settled else self.recent_time(_HOUR_US)

    def events(self, settled: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rng, ts = self.rng, self._flat_time(settled)
        rid = self.root_id(ts)
        etype = rng.choice(("task.succeeded", "task.failed", "workflow.closed", "queue.paused"))
        root = {
            "namespace_id": self.ns_id,
            "id": rid,
            "type": etype,
            "subject_id": uuid7_from(rng, unix_ms(ts)) if rng.random() < 0.9 else None,
            "payload_json": self.payload("event", type=etype),
            "created_at": ts,
        }
        return root, []

    def audit(self, settled: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rng, ts = self.rng, self._flat_time(settled)
        rid = self.root_id(ts)
        action = rng.choice(("queue.create", "credential.create", "task.cancel", "plan.set"))
        target = uuid7_from(rng, unix_ms(ts)).hex()
        detail = json_text({"target": target, "note": self.memo()}, {"limit": exact_decimal(rng)})
        root = {
            "namespace_id": self.ns_id,
            "id": rid,
            "actor": rng.choice(("alice", "bob", "ops-bot", "ci")),
            "action": action,
            "target_kind": action.split(".")[0],
            "target_id": target,
            "detail_json": detail,
            "created_at": ts,
        }
        return root, []

    def deliveries(self, settled: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rng, k = self.rng, self.child_count(settled)
        finished: datetime | None
        if settled:
            ts = finished = self.settled_time()
            created = finished - self.dur(10, 3_600_000)
            state = rng.choices(("DELIVERED", "FAILED"), (90, 10))[0]
        else:
            created = self.recent_time(_DAY_US)
            finished, ts = None, created
            state = "RETRYING" if k else "PENDING"
        rid = self.root_id(ts)
        codes = [
            (200 if (i == k - 1 and state == "DELIVERED") else rng.choice((500, 503, None)))
            for i in range(k)
        ]
        root = {
            "namespace_id": self.ns_id,
            "id": rid,
            "event_id": uuid7_from(rng, unix_ms(created)),
            "endpoint_url": f"https://hooks.example.com/{rng.choice(('orders', 'ci'))}/{self.n}",
            "state": state,
            "payload_json": self.payload("delivery", attempt_limit=10),
            "last_status": codes[-1] if codes else None,
            "created_at": created,
            "finished_at": finished,
        }
        children = []
        for i, (s, e) in enumerate(self.spans(created, finished or self.now, k), start=1):
            code = codes[i - 1]
            err = "" if code == 200 else ("TIMEOUT" if code is None else "HTTP_5XX")
            children.append(
                {
                    "namespace_id": self.ns_id,
                    "delivery_id": rid,
                    "attempt_no": i,
                    "status_code": code,
                    "error_code": err,
                    "duration_ms": (e - s) // timedelta(milliseconds=1),
                    "started_at": s,
                    "finished_at": e,
                }
            )
        return root, children

    def inbox(self, settled: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rng = self.rng
        processed: datetime | None
        if settled:
            ts = processed = self.settled_time()
            received = processed - self.dur(1, 600_000)
            state = rng.choices(("PROCESSED", "REJECTED"), (95, 5))[0]
        else:
            received = self.recent_time(_DAY_US)
            processed, state, ts = None, "RECEIVED", received
        rid = self.root_id(ts)
        root = {
            "namespace_id": self.ns_id,
            "id": rid,
            "source": rng.choice(("stripe", "github", "shopify", "partner-api")),
            "message_key": f"msg-{rid.hex()}",
            "state": state,
            "payload_json": self.payload("inbox", delivery_attempt=rng.randint(1, 3)),
            "received_at": received,
            "processed_at": processed,
        }
        return root, []

    def idempotency(self, settled: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rng = self.rng
        if settled:  # expired at least an hour ago
            expires = self.settled_time()
            created = expires - IDEMPOTENCY_RETENTION
        else:  # still within its retention window: expires in the future
            created = self.now - timedelta(microseconds=rng.randrange(72 * _HOUR_US))
            expires = created + IDEMPOTENCY_RETENTION
        rid = self.root_id(expires if settled else created)
        request = self.payload("idempotency")
        task_id = uuid7_from(rng, unix_ms(created))
        receipt = json_text(
            {"task_id": task_id.hex(), "accepted_at": iso(created), "memo": self.memo()},
            {"quota_left": exact_decimal(rng)},
        )
        root = {
            "namespace_id": self.ns_id,
            "id": rid,
            "idempotency_key": f"op-{rid.hex()}",
            "request_sha256": hashlib.sha256(request.encode("utf-8")).hexdigest(),
            "task_id": task_id,
            "receipt_json": receipt,
            "created_at": created,
            "expires_at": expires,
        }
        return root, []


def generate(
    spec: SeedSpec,
    ns_id: bytes,
    queue_ids: list[bytes],
    rng: random.Random,
    now: datetime,
    chunk_roots: int = CHUNK_ROOTS,
) -> Iterator[Chunk]:
    """Yield the rows of ``spec`` in chunks of ``chunk_roots`` roots. Pure (no I/O)."""
    if spec.kind == "tasks" and not queue_ids:
        raise InvalidInput("kind 'tasks' needs at least one queue id")
    gen = _Gen(spec, ns_id, queue_ids, rng, now)
    make_root = getattr(gen, spec.kind)
    chunk = Chunk()
    for _ in range(spec.roots):
        settled = rng.random() < spec.settled_fraction
        root, children = make_root(settled)
        chunk.roots.append(root)
        chunk.children.extend(children)
        chunk.settled += settled
        if len(chunk.roots) >= chunk_roots:
            yield chunk
            chunk = Chunk()
    if chunk.roots:
        yield chunk


def insert_chunk(conn: Connection, kind: HistoryKind, chunk: Chunk) -> None:
    """Bulk insert one chunk (one ``executemany`` per table) in the caller's transaction."""
    try:
        conn.execute(insert(kind.root), chunk.roots)
        if chunk.children:
            conn.execute(insert(kind.children[0].table), chunk.children)
    except IntegrityError:
        raise ConflictError(
            f"generated {kind.name} rows collide with existing rows (same ids); "
            "use another --seed or omit --random-ids"
        ) from None


def seed_history(
    conn: Connection,
    spec: SeedSpec,
    ns_id: bytes,
    queue_ids: list[bytes],
    rng: random.Random,
    now: datetime,
) -> SeedResult:
    """Generate and insert ``spec`` into ``conn`` (the caller's one transaction)."""
    kind = HISTORY_KINDS[spec.kind]
    roots = settled = kids = 0
    for chunk in generate(spec, ns_id, queue_ids, rng, now, CHUNK_ROOTS):
        insert_chunk(conn, kind, chunk)
        roots += len(chunk.roots)
        settled += chunk.settled
        kids += len(chunk.children)
    children = {c.table.name: kids for c in kind.children}
    return SeedResult(spec.kind, kind.root.name, roots, settled, roots - settled, children)
