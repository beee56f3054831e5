"""History source tables of the platform (SPEC §3), one root table per kind plus children.

Every root is keyed (``namespace_id``, ``id``) and has an index (``namespace_id``, settled column,
``id``) for the archive's keyset scan. A root is settled (immutable, archivable) once its settled
column is set. Children carry their root as ``task_id`` / ``workflow_id`` / ``delivery_id``.
"""

from __future__ import annotations

from sqlalchemy import Column, Index, PrimaryKeyConstraint, Table, UniqueConstraint, text

from orbit_tasks.db.platform_tables import MYSQL_TABLE, metadata
from orbit_tasks.db.types import Ascii, DateTime6, Hex64, Id16, JsonText, Str, UInt, utc_now_default


def _created() -> Column:
    return Column("created_at", DateTime6(), nullable=False, server_default=utc_now_default())


tasks = Table(
    "orbit_tasks",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("id", Id16(), nullable=False),
    Column("queue_id", Id16(), nullable=False),
    Column("state", Str(16), nullable=False),
    # ascii_bin like the sender's key column: compared byte-exact, no PAD SPACE equality.
    Column("idempotency_key", Ascii(128), nullable=True),
    Column("request_json", JsonText(), nullable=False, comment="submitted body, byte-exact"),
    Column("result_json", JsonText(), nullable=True),
    Column("error_code", Str(32), nullable=False, server_default=text("''")),
    Column("attempts", UInt(), nullable=False, server_default=text("0")),
    _created(),
    Column("started_at", DateTime6(), nullable=True),
    Column("finished_at", DateTime6(), nullable=True, comment="settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_task_settled", "namespace_id", "finished_at", "id"),
    Index("ix_task_queue", "namespace_id", "queue_id", "created_at"),
    comment="tasks (history kind tasks)",
    **MYSQL_TABLE,
)

task_attempts = Table(
    "orbit_task_attempts",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("task_id", Id16(), nullable=False),
    Column("attempt_no", UInt(), nullable=False),
    Column("state", Str(16), nullable=False),
    Column("worker", Str(128), nullable=False, server_default=text("''")),
    Column("error_code", Str(32), nullable=False, server_default=text("''")),
    Column("started_at", DateTime6(), nullable=False),
    Column("finished_at", DateTime6(), nullable=True),
    PrimaryKeyConstraint("namespace_id", "task_id", "attempt_no"),
    comment="task attempts (child of orbit_tasks)",
    **MYSQL_TABLE,
)

workflows = Table(
    "orbit_workflows",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("id", Id16(), nullable=False),
    Column("name", Str(128), nullable=False),
    Column("state", Str(16), nullable=False),
    Column("input_json", JsonText(), nullable=False),
    _created(),
    Column("closed_at", DateTime6(), nullable=True, comment="settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_workflow_settled", "namespace_id", "closed_at", "id"),
    comment="workflows (history kind workflows)",
    **MYSQL_TABLE,
)

workflow_steps = Table(
    "orbit_workflow_steps",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("workflow_id", Id16(), nullable=False),
    Column("step_no", UInt(), nullable=False),
    Column("name", Str(128), nullable=False),
    Column("state", Str(16), nullable=False),
    Column("task_id", Id16(), nullable=True),
    Column("output_json", JsonText(), nullable=True),
    Column("started_at", DateTime6(), nullable=True),
    Column("finished_at", DateTime6(), nullable=True),
    PrimaryKeyConstraint("namespace_id", "workflow_id", "step_no"),
    comment="workflow steps (child of orbit_workflows)",
    **MYSQL_TABLE,
)

events = Table(
    "orbit_events",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("id", Id16(), nullable=False),
    Column("type", Str(64), nullable=False),
    Column("subject_id", Id16(), nullable=True),
    Column("payload_json", JsonText(), nullable=False),
    Column(
        "created_at",
        DateTime6(),
        nullable=False,
        server_default=utc_now_default(),
        comment="settled column",
    ),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_event_settled", "namespace_id", "created_at", "id"),
    comment="platform events (history kind events)",
    **MYSQL_TABLE,
)

audit_events = Table(
    "orbit_audit_events",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("id", Id16(), nullable=False),
    Column("actor", Str(128), nullable=False),
    Column("action", Str(64), nullable=False),
    Column("target_kind", Str(32), nullable=False),
    Column("target_id", Str(64), nullable=False, server_default=text("''")),
    Column("detail_json", JsonText(), nullable=False),
    Column(
        "created_at",
        DateTime6(),
        nullable=False,
        server_default=utc_now_default(),
        comment="settled column",
    ),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_audit_settled", "namespace_id", "created_at", "id"),
    comment="audit log (history kind audit); never secrets",
    **MYSQL_TABLE,
)

deliveries = Table(
    "orbit_deliveries",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("id", Id16(), nullable=False),
    Column("event_id", Id16(), nullable=True),
    Column("endpoint_url", Str(512), nullable=False),
    Column("state", Str(16), nullable=False),
    Column("payload_json", JsonText(), nullable=False),
    Column("last_status", UInt(), nullable=True),
    _created(),
    Column("finished_at", DateTime6(), nullable=True, comment="settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_delivery_settled", "namespace_id", "finished_at", "id"),
    comment="webhook deliveries (history kind deliveries)",
    **MYSQL_TABLE,
)

delivery_attempts = Table(
    "orbit_delivery_attempts",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("delivery_id", Id16(), nullable=False),
    Column("attempt_no", UInt(), nullable=False),
    Column("status_code", UInt(), nullable=True),
    Column("error_code", Str(32), nullable=False, server_default=text("''")),
    Column("duration_ms", UInt(), nullable=False, server_default=text("0")),
    Column("started_at", DateTime6(), nullable=False),
    Column("finished_at", DateTime6(), nullable=True),
    PrimaryKeyConstraint("namespace_id", "delivery_id", "attempt_no"),
    comment="delivery attempts (child of orbit_deliveries)",
    **MYSQL_TABLE,
)

inbox_messages = Table(
    "orbit_inbox_messages",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("id", Id16(), nullable=False),
    Column("source", Str(64), nullable=False),
    Column("message_key", Str(128), nullable=False),
    Column("state", Str(16), nullable=False),
    Column("payload_json", JsonText(), nullable=False),
    Column("received_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    Column("processed_at", DateTime6(), nullable=True, comment="settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    UniqueConstraint("namespace_id", "source", "message_key", name="uq_inbox_message"),
    Index("ix_inbox_settled", "namespace_id", "processed_at", "id"),
    comment="inbox messages (history kind inbox)",
    **MYSQL_TABLE,
)

idempotency_records = Table(
    "orbit_idempotency_records",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("id", Id16(), nullable=False),
    Column("idempotency_key", Ascii(128), nullable=False),
    Column("request_sha256", Hex64(), nullable=False),
    Column("task_id", Id16(), nullable=False),
    Column("receipt_json", JsonText(), nullable=False, comment="the original receipt, byte-exact"),
    _created(),
    Column("expires_at", DateTime6(), nullable=False, comment="settled column; 72 h retention"),
    PrimaryKeyConstraint("namespace_id", "id"),
    UniqueConstraint("namespace_id", "idempotency_key", name="uq_idempotency_key"),
    Index("ix_idempotency_settled", "namespace_id", "expires_at", "id"),
    comment="idempotency records (history kind idempotency)",
    **MYSQL_TABLE,
)
