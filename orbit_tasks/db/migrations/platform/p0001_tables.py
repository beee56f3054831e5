"""The platform tables of revision p0001, frozen (SPEC §12).

A copy of ``orbit_tasks/db/platform_tables.py`` and ``history_tables.py`` as they were when p0001
was written: the two seed tables byte for byte as ``seeds/orbit_archive.sql``, and the tables of
SPEC §3. Never edit this file; a schema change is a new revision. The live modules describe the
head; ``tests/integration/test_migrations_frozen.py`` proves they still agree with this copy.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Column,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    UniqueConstraint,
    false,
    text,
)

from orbit_tasks.db.migrations.frozen_0001 import PLATFORM_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import (
    ascii_str,
    boolean,
    datetime6,
    hex64,
    id16,
    json_text,
    now6,
    ubigint,
    uint,
    varchar,
)

REVISION = "p0001"
KIND_CHECK = "kind IN ('tasks','workflows','events','audit','deliveries','inbox','idempotency')"

metadata = MetaData()


def _now(name: str, comment: str | None = None) -> Column:
    return Column(name, datetime6(), nullable=False, server_default=now6(), comment=comment)


def _zero(name: str, type_: Any, comment: str | None = None) -> Column:
    return Column(name, type_, nullable=False, server_default=text("0"), comment=comment)


def _empty(name: str, type_: Any, comment: str | None = None) -> Column:
    return Column(name, type_, nullable=False, server_default=text("''"), comment=comment)


Table(
    "orbit_archive_plans",
    metadata,
    Column("namespace_id", id16(), nullable=False, comment="所属命名空间，由事务核验"),
    Column("kind", varchar(16), nullable=False, comment="固定历史类别，同一命名空间每类一个计划"),
    Column(
        "revision",
        ubigint(),
        nullable=False,
        server_default=text("1"),
        comment="配置版本，后台触发不修改此版本",
    ),
    Column(
        "enabled",
        boolean(),
        nullable=False,
        server_default=false(),
        comment="是否触发新作业，不中断已有作业",
    ),
    Column("policy_revision", ubigint(), nullable=False, comment="管理员确认的保留策略版本"),
    Column(
        "storage_id", id16(), nullable=False, comment="固定归档卷身份，接管节点必须挂载同一物理卷"
    ),
    Column(
        "interval_seconds",
        uint(),
        nullable=False,
        comment="周期秒数，3600至2592000，错过多次合并一次",
    ),
    Column("batch_size", uint(), nullable=False, comment="每批根记录上限，1至100"),
    Column("max_bytes", ubigint(), nullable=False, comment="新作业累计文件字节预算，1MiB至1GiB"),
    Column("next_run_at", datetime6(), nullable=False, comment="下次触发UTC时间，首次启用立即到期"),
    Column(
        "active_job_id", id16(), nullable=True, comment="未完成或失败待处理作业，成功或关闭后为空"
    ),
    _now("created_at", "首次保存UTC时间"),
    _now("updated_at", "配置最后修改UTC时间"),
    PrimaryKeyConstraint("namespace_id", "kind"),
    Index("ix_archive_plan_due", "storage_id", "enabled", "next_run_at"),
    CheckConstraint(KIND_CHECK, name="ck_archive_plan_kind"),
    CheckConstraint(
        "revision>0 AND policy_revision>0 AND interval_seconds BETWEEN 3600 AND 2592000 AND "
        "batch_size BETWEEN 1 AND 100 AND max_bytes BETWEEN 1048576 AND 1073741824",
        name="ck_archive_plan_config",
    ),
    comment="按命名空间和类别配置的周期归档计划，无外键",
    **OPTS,
)

Table(
    "orbit_archive_jobs",
    metadata,
    Column("namespace_id", id16(), nullable=False, comment="所属命名空间，由事务核验"),
    Column("id", id16(), nullable=False, comment="作业及目录及文件清单的固定标识"),
    Column("kind", varchar(16), nullable=False, comment="创建时固定的历史类别"),
    Column("plan_revision", ubigint(), nullable=False, comment="创建时固定的计划版本"),
    Column("policy_revision", ubigint(), nullable=False, comment="创建时固定的保留策略版本"),
    Column("storage_id", id16(), nullable=False, comment="固定归档卷身份，不允许跨独立磁盘接管"),
    Column("batch_size", uint(), nullable=False, comment="创建时固定的单批根记录上限"),
    Column("max_bytes", ubigint(), nullable=False, comment="累计文件字节预算，人工重试仅可提高"),
    Column(
        "state",
        varchar(16),
        nullable=False,
        server_default=text("'PENDING'"),
        comment="PENDING待领取RUNNING执行中SUCCEEDED完成FAILED待处理ABANDONED已关闭",
    ),
    Column(
        "revision",
        ubigint(),
        nullable=False,
        server_default=text("1"),
        comment="状态并发版本，领取确认和人工操作递增",
    ),
    _zero("attempts", uint(), "累计领取次数，包含分批继续和崩溃接管"),
    _zero("batches", uint(), "已验证并入库的连续文件批次数"),
    _zero("roots", ubigint(), "已确认根记录总数"),
    _zero("bytes", ubigint(), "已确认清单及批次总字节数"),
    _empty("last_sha256", hex64(), "已确认文件链尾摘要，恢复必须验证此前缀"),
    _empty("error_code", varchar(32), "固定失败分类，不记录原始异常或业务内容"),
    Column("lease_id", id16(), nullable=True, comment="领取随机代次，非执行中为空"),
    Column(
        "lease_until", datetime6(), nullable=True, comment="UTC租约截止，过期可接管，非执行中为空"
    ),
    _now("created_at", "作业创建UTC时间"),
    _now("updated_at", "状态最后变更UTC时间"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_archive_job_claim", "storage_id", "state", "lease_until", "updated_at"),
    Index("ix_archive_job_list", "namespace_id", "created_at", "id"),
    CheckConstraint(
        "state IN ('PENDING','RUNNING','SUCCEEDED','FAILED','ABANDONED')",
        name="ck_archive_job_state",
    ),
    CheckConstraint(
        "revision>0 AND plan_revision>0 AND policy_revision>0 AND batch_size BETWEEN 1 AND 100 "
        "AND max_bytes BETWEEN 1048576 AND 1073741824",
        name="ck_archive_job_config",
    ),
    CheckConstraint(
        "(state='RUNNING' AND lease_id IS NOT NULL AND lease_until IS NOT NULL) OR "
        "(state<>'RUNNING' AND lease_id IS NULL AND lease_until IS NULL)",
        name="ck_archive_job_lease",
    ),
    comment="持久归档作业及租约，只读源数据，无外键",
    **OPTS,
)

# --- SPEC §3: tenants, volumes, retention policies, API queues and credentials -----------------

Table(
    "orbit_namespaces",
    metadata,
    Column("id", id16(), nullable=False, comment="命名空间标识 (UUIDv7)"),
    Column("name", varchar(64), nullable=False, comment="唯一名称"),
    Column(
        "state",
        varchar(16),
        nullable=False,
        server_default=text("'ACTIVE'"),
        comment="ACTIVE or DISABLED",
    ),
    _now("created_at"),
    PrimaryKeyConstraint("id"),
    UniqueConstraint("name", name="uq_namespace_name"),
    CheckConstraint("state IN ('ACTIVE','DISABLED')", name="ck_namespace_state"),
    comment="tenants",
    **OPTS,
)

Table(
    "orbit_archive_storages",
    metadata,
    Column("storage_id", id16(), nullable=False, comment="identity written to .orbit-volume.json"),
    _empty("label", varchar(128)),
    _now("created_at"),
    PrimaryKeyConstraint("storage_id"),
    comment="registry of archive volumes",
    **OPTS,
)

Table(
    "orbit_archive_policies",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("kind", varchar(16), nullable=False),
    Column("revision", ubigint(), nullable=False),
    Column("archive_after_seconds", ubigint(), nullable=False),
    _now("created_at"),
    Column("created_by", varchar(128), nullable=False),
    PrimaryKeyConstraint("namespace_id", "kind", "revision"),
    CheckConstraint(KIND_CHECK, name="ck_archive_policy_kind"),
    CheckConstraint("revision>0 AND archive_after_seconds>=3600", name="ck_archive_policy_config"),
    comment="append-only retention policy revisions per namespace and kind",
    **OPTS,
)

Table(
    "orbit_queues",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("id", id16(), nullable=False),
    Column("name", varchar(64), nullable=False),
    _now("created_at"),
    PrimaryKeyConstraint("namespace_id", "id"),
    UniqueConstraint("namespace_id", "name", name="uq_queue_name"),
    comment="task queues per namespace",
    **OPTS,
)

Table(
    "orbit_credentials",
    metadata,
    Column("id", id16(), nullable=False),
    Column("namespace_id", id16(), nullable=False, comment="the one namespace the token acts in"),
    Column(
        "token_sha256", hex64(), nullable=False, comment="SHA-256 of the token; never the token"
    ),
    Column(
        "queue_ids",
        json_text(),
        nullable=True,
        comment="JSON list of allowed queue ids (hex); NULL = every queue of the namespace",
    ),
    _empty("label", varchar(128)),
    _now("created_at"),
    Column("revoked_at", datetime6(), nullable=True),
    PrimaryKeyConstraint("id"),
    UniqueConstraint("token_sha256", name="uq_credential_token"),
    Index("ix_credential_namespace", "namespace_id", "created_at"),
    comment="API tokens, stored as SHA-256, bound to one namespace and a queue allow-list",
    **OPTS,
)

# --- SPEC §3: history source tables, one root per kind plus children ---------------------------

Table(
    "orbit_tasks",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("id", id16(), nullable=False),
    Column("queue_id", id16(), nullable=False),
    Column("state", varchar(16), nullable=False),
    Column("idempotency_key", ascii_str(128), nullable=True),
    Column("request_json", json_text(), nullable=False, comment="submitted body, byte-exact"),
    Column("result_json", json_text(), nullable=True),
    _empty("error_code", varchar(32)),
    _zero("attempts", uint()),
    _now("created_at"),
    Column("started_at", datetime6(), nullable=True),
    Column("finished_at", datetime6(), nullable=True, comment="settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_task_settled", "namespace_id", "finished_at", "id"),
    Index("ix_task_queue", "namespace_id", "queue_id", "created_at"),
    comment="tasks (history kind tasks)",
    **OPTS,
)

Table(
    "orbit_task_attempts",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("task_id", id16(), nullable=False),
    Column("attempt_no", uint(), nullable=False),
    Column("state", varchar(16), nullable=False),
    _empty("worker", varchar(128)),
    _empty("error_code", varchar(32)),
    Column("started_at", datetime6(), nullable=False),
    Column("finished_at", datetime6(), nullable=True),
    PrimaryKeyConstraint("namespace_id", "task_id", "attempt_no"),
    comment="task attempts (child of orbit_tasks)",
    **OPTS,
)

Table(
    "orbit_workflows",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("id", id16(), nullable=False),
    Column("name", varchar(128), nullable=False),
    Column("state", varchar(16), nullable=False),
    Column("input_json", json_text(), nullable=False),
    _now("created_at"),
    Column("closed_at", datetime6(), nullable=True, comment="settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_workflow_settled", "namespace_id", "closed_at", "id"),
    comment="workflows (history kind workflows)",
    **OPTS,
)

Table(
    "orbit_workflow_steps",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("workflow_id", id16(), nullable=False),
    Column("step_no", uint(), nullable=False),
    Column("name", varchar(128), nullable=False),
    Column("state", varchar(16), nullable=False),
    Column("task_id", id16(), nullable=True),
    Column("output_json", json_text(), nullable=True),
    Column("started_at", datetime6(), nullable=True),
    Column("finished_at", datetime6(), nullable=True),
    PrimaryKeyConstraint("namespace_id", "workflow_id", "step_no"),
    comment="workflow steps (child of orbit_workflows)",
    **OPTS,
)

Table(
    "orbit_events",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("id", id16(), nullable=False),
    Column("type", varchar(64), nullable=False),
    Column("subject_id", id16(), nullable=True),
    Column("payload_json", json_text(), nullable=False),
    _now("created_at", "settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_event_settled", "namespace_id", "created_at", "id"),
    comment="platform events (history kind events)",
    **OPTS,
)

Table(
    "orbit_audit_events",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("id", id16(), nullable=False),
    Column("actor", varchar(128), nullable=False),
    Column("action", varchar(64), nullable=False),
    Column("target_kind", varchar(32), nullable=False),
    _empty("target_id", varchar(64)),
    Column("detail_json", json_text(), nullable=False),
    _now("created_at", "settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_audit_settled", "namespace_id", "created_at", "id"),
    comment="audit log (history kind audit); never secrets",
    **OPTS,
)

Table(
    "orbit_deliveries",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("id", id16(), nullable=False),
    Column("event_id", id16(), nullable=True),
    Column("endpoint_url", varchar(512), nullable=False),
    Column("state", varchar(16), nullable=False),
    Column("payload_json", json_text(), nullable=False),
    Column("last_status", uint(), nullable=True),
    _now("created_at"),
    Column("finished_at", datetime6(), nullable=True, comment="settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    Index("ix_delivery_settled", "namespace_id", "finished_at", "id"),
    comment="webhook deliveries (history kind deliveries)",
    **OPTS,
)

Table(
    "orbit_delivery_attempts",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("delivery_id", id16(), nullable=False),
    Column("attempt_no", uint(), nullable=False),
    Column("status_code", uint(), nullable=True),
    _empty("error_code", varchar(32)),
    _zero("duration_ms", uint()),
    Column("started_at", datetime6(), nullable=False),
    Column("finished_at", datetime6(), nullable=True),
    PrimaryKeyConstraint("namespace_id", "delivery_id", "attempt_no"),
    comment="delivery attempts (child of orbit_deliveries)",
    **OPTS,
)

Table(
    "orbit_inbox_messages",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("id", id16(), nullable=False),
    Column("source", varchar(64), nullable=False),
    Column("message_key", varchar(128), nullable=False),
    Column("state", varchar(16), nullable=False),
    Column("payload_json", json_text(), nullable=False),
    _now("received_at"),
    Column("processed_at", datetime6(), nullable=True, comment="settled column"),
    PrimaryKeyConstraint("namespace_id", "id"),
    UniqueConstraint("namespace_id", "source", "message_key", name="uq_inbox_message"),
    Index("ix_inbox_settled", "namespace_id", "processed_at", "id"),
    comment="inbox messages (history kind inbox)",
    **OPTS,
)

Table(
    "orbit_idempotency_records",
    metadata,
    Column("namespace_id", id16(), nullable=False),
    Column("id", id16(), nullable=False),
    Column("idempotency_key", ascii_str(128), nullable=False),
    Column("request_sha256", hex64(), nullable=False),
    Column("task_id", id16(), nullable=False),
    Column("receipt_json", json_text(), nullable=False, comment="the original receipt, byte-exact"),
    _now("created_at"),
    Column("expires_at", datetime6(), nullable=False, comment="settled column; 72 h retention"),
    PrimaryKeyConstraint("namespace_id", "id"),
    UniqueConstraint("namespace_id", "idempotency_key", name="uq_idempotency_key"),
    Index("ix_idempotency_settled", "namespace_id", "expires_at", "id"),
    comment="idempotency records (history kind idempotency)",
    **OPTS,
)
