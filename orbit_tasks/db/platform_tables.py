"""Platform database schema (SQLAlchemy Core).

``orbit_archive_plans`` and ``orbit_archive_jobs`` are the seed DDL (``seeds/``) byte for
byte: column order, types, defaults, comments, index and CHECK names. The other tables are SPEC §3.
No foreign keys anywhere (seed rule); cross-table consistency is checked inside transactions.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Column,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    UniqueConstraint,
    false,
    text,
)

from orbit_tasks.db.types import (
    Ascii,
    Bool,
    DateTime6,
    Hex64,
    Id16,
    JsonText,
    Str,
    UBigInt,
    UInt,
    utc_now_default,
)

KINDS = ("tasks", "workflows", "events", "audit", "deliveries", "inbox", "idempotency")
KIND_CHECK = "kind IN ('tasks','workflows','events','audit','deliveries','inbox','idempotency')"

# Table options for every platform table (MySQL 8 names; mapped for MariaDB in collation.py).
MYSQL_TABLE: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_0900_as_cs",
}

metadata = MetaData()

archive_plans = Table(
    "orbit_archive_plans",
    metadata,
    Column("namespace_id", Id16(), nullable=False, comment="所属命名空间，由事务核验"),
    Column("kind", Str(16), nullable=False, comment="固定历史类别，同一命名空间每类一个计划"),
    Column(
        "revision",
        UBigInt(),
        nullable=False,
        server_default=text("1"),
        comment="配置版本，后台触发不修改此版本",
    ),
    Column(
        "enabled",
        Bool(),
        nullable=False,
        server_default=false(),
        comment="是否触发新作业，不中断已有作业",
    ),
    Column("policy_revision", UBigInt(), nullable=False, comment="管理员确认的保留策略版本"),
    Column(
        "storage_id", Id16(), nullable=False, comment="固定归档卷身份，接管节点必须挂载同一物理卷"
    ),
    Column(
        "interval_seconds",
        UInt(),
        nullable=False,
        comment="周期秒数，3600至2592000，错过多次合并一次",
    ),
    Column("batch_size", UInt(), nullable=False, comment="每批根记录上限，1至100"),
    Column("max_bytes", UBigInt(), nullable=False, comment="新作业累计文件字节预算，1MiB至1GiB"),
    Column("next_run_at", DateTime6(), nullable=False, comment="下次触发UTC时间，首次启用立即到期"),
    Column(
        "active_job_id", Id16(), nullable=True, comment="未完成或失败待处理作业，成功或关闭后为空"
    ),
    Column(
        "created_at",
        DateTime6(),
        nullable=False,
        server_default=utc_now_default(),
        comment="首次保存UTC时间",
    ),
    Column(
        "updated_at",
        DateTime6(),
        nullable=False,
        server_default=utc_now_default(),
        comment="配置最后修改UTC时间",
    ),
    PrimaryKeyConstraint("namespace_id", "kind"),
    Index("ix_archive_plan_due", "storage_id", "enabled", "next_run_at"),
    CheckConstraint(KIND_CHECK, name="ck_archive_plan_kind"),
    CheckConstraint(
        "revision>0 AND policy_revision>0 AND interval_seconds BETWEEN 3600 AND 2592000 AND "
        "batch_size BETWEEN 1 AND 100 AND max_bytes BETWEEN 1048576 AND 1073741824",
        name="ck_archive_plan_config",
    ),
    comment="按命名空间和类别配置的周期归档计划，无外键",
    **MYSQL_TABLE,
)

archive_jobs = Table(
    "orbit_archive_jobs",
    metadata,
    Column("namespace_id", Id16(), nullable=False, comment="所属命名空间，由事务核验"),
    Column("id", Id16(), nullable=False, comment="作业及目录及文件清单的固定标识"),
    Column("kind", Str(16), nullable=False, comment="创建时固定的历史类别"),
    Column("plan_revision", UBigInt(), nullable=False, comment="创建时固定的计划版本"),
    Column("policy_revision", UBigInt(), nullable=False, comment="创建时固定的保留策略版本"),
    Column("storage_id", Id16(), nullable=False, comment="固定归档卷身份，不允许跨独立磁盘接管"),
    Column("batch_size", UInt(), nullable=False, comment="创建时固定的单批根记录上限"),
    Column("max_bytes", UBigInt(), nullable=False, comment="累计文件字节预算，人工重试仅可提高"),
    Column(
        "state",
        Str(16),
        nullable=False,
        server_default=text("'PENDING'"),
        comment="PENDING待领取RUNNING执行中SUCCEEDED完成FAILED待处理ABANDONED已关闭",
    ),
    Column(
        "revision",
        UBigInt(),
        nullable=False,
        server_default=text("1"),
        comment="状态并发版本，领取确认和人工操作递增",
    ),
    Column(
        "attempts",
        UInt(),
        nullable=False,
        server_default=text("0"),
        comment="累计领取次数，包含分批继续和崩溃接管",
    ),
    Column(
        "batches",
        UInt(),
        nullable=False,
        server_default=text("0"),
        comment="已验证并入库的连续文件批次数",
    ),
    Column(
        "roots", UBigInt(), nullable=False, server_default=text("0"), comment="已确认根记录总数"
    ),
    Column(
        "bytes",
        UBigInt(),
        nullable=False,
        server_default=text("0"),
        comment="已确认清单及批次总字节数",
    ),
    Column(
        "last_sha256",
        Hex64(),
        nullable=False,
        server_default=text("''"),
        comment="已确认文件链尾摘要，恢复必须验证此前缀",
    ),
    Column(
        "error_code",
        Str(32),
        nullable=False,
        server_default=text("''"),
        comment="固定失败分类，不记录原始异常或业务内容",
    ),
    Column("lease_id", Id16(), nullable=True, comment="领取随机代次，非执行中为空"),
    Column(
        "lease_until", DateTime6(), nullable=True, comment="UTC租约截止，过期可接管，非执行中为空"
    ),
    Column(
        "created_at",
        DateTime6(),
        nullable=False,
        server_default=utc_now_default(),
        comment="作业创建UTC时间",
    ),
    Column(
        "updated_at",
        DateTime6(),
        nullable=False,
        server_default=utc_now_default(),
        comment="状态最后变更UTC时间",
    ),
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
    **MYSQL_TABLE,
)

# --- SPEC §3: tenants, volumes, retention policies, API queues and credentials -----------------

namespaces = Table(
    "orbit_namespaces",
    metadata,
    Column("id", Id16(), nullable=False, comment="命名空间标识 (UUIDv7)"),
    Column("name", Str(64), nullable=False, comment="唯一名称"),
    Column(
        "state",
        Str(16),
        nullable=False,
        server_default=text("'ACTIVE'"),
        comment="ACTIVE or DISABLED",
    ),
    Column("created_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("id"),
    UniqueConstraint("name", name="uq_namespace_name"),
    CheckConstraint("state IN ('ACTIVE','DISABLED')", name="ck_namespace_state"),
    comment="tenants",
    **MYSQL_TABLE,
)

archive_storages = Table(
    "orbit_archive_storages",
    metadata,
    Column("storage_id", Id16(), nullable=False, comment="identity written to .orbit-volume.json"),
    Column("label", Str(128), nullable=False, server_default=text("''")),
    Column("created_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("storage_id"),
    comment="registry of archive volumes",
    **MYSQL_TABLE,
)

# Revision p0003 (issue 18): where an S3 storage lives (not a secret; no credentials).
archive_object_storages = Table(
    "orbit_archive_object_storages",
    metadata,
    Column("storage_id", Id16(), nullable=False, comment="the storage of orbit_archive_storages"),
    Column("bucket", Str(63), nullable=False),
    Column("prefix", Str(512), nullable=False, server_default=text("''")),
    Column("endpoint", Str(255), nullable=False, server_default=text("''")),
    Column("region", Str(64), nullable=False, server_default=text("''")),
    Column("path_style", Bool(), nullable=False, server_default=false()),
    Column("storage_class", Str(32), nullable=False, server_default=text("''")),
    Column("sse", Str(16), nullable=False, server_default=text("''")),
    Column("kms_key_id", Str(255), nullable=False, server_default=text("''")),
    Column("created_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("storage_id"),
    Index("ix_archive_object_storage_bucket", "bucket"),
    comment="S3 locations of archive storages: bucket, prefix, endpoint and write options",
    **MYSQL_TABLE,
)

# Revision p0006 (issue 25): the effective end of a job's range, fixed before its first batch.
archive_job_ends = Table(
    "orbit_archive_job_ends",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("job_id", Id16(), nullable=False, comment="the job of orbit_archive_jobs"),
    Column("range_until", DateTime6(), nullable=False, comment="the end: a settled time"),
    Column("until_id", Id16(), nullable=True, comment="with range_until, a key (settled, id)"),
    Column("policy_until", DateTime6(), nullable=False, comment="the end the policy gives"),
    Column("roots_total", UBigInt(), nullable=False, comment="roots of the range"),
    Column("sample_roots", UBigInt(), nullable=False, comment="roots of the size sample"),
    Column("sample_bytes", UBigInt(), nullable=False, comment="their bytes, packed as files"),
    Column("recorded_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("namespace_id", "job_id"),
    comment="effective ends of archive job ranges (SPEC 5 budget-sized ranges)",
    **MYSQL_TABLE,
)

archive_policies = Table(
    "orbit_archive_policies",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("kind", Str(16), nullable=False),
    Column("revision", UBigInt(), nullable=False),
    Column("archive_after_seconds", UBigInt(), nullable=False),
    Column("created_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    Column("created_by", Str(128), nullable=False),
    PrimaryKeyConstraint("namespace_id", "kind", "revision"),
    CheckConstraint(KIND_CHECK, name="ck_archive_policy_kind"),
    CheckConstraint("revision>0 AND archive_after_seconds>=3600", name="ck_archive_policy_config"),
    comment="append-only retention policy revisions per namespace and kind",
    **MYSQL_TABLE,
)

queues = Table(
    "orbit_queues",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("id", Id16(), nullable=False),
    Column("name", Str(64), nullable=False),
    Column("created_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("namespace_id", "id"),
    UniqueConstraint("namespace_id", "name", name="uq_queue_name"),
    comment="task queues per namespace",
    **MYSQL_TABLE,
)

credentials = Table(
    "orbit_credentials",
    metadata,
    Column("id", Id16(), nullable=False),
    Column("namespace_id", Id16(), nullable=False, comment="the one namespace the token acts in"),
    Column(
        "token_sha256", Hex64(), nullable=False, comment="SHA-256 of the token; never the token"
    ),
    Column(
        "queue_ids",
        JsonText(),
        nullable=True,
        comment="JSON list of allowed queue ids (hex); NULL = every queue of the namespace",
    ),
    Column("label", Str(128), nullable=False, server_default=text("''")),
    Column("created_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    Column("revoked_at", DateTime6(), nullable=True),
    PrimaryKeyConstraint("id"),
    UniqueConstraint("token_sha256", name="uq_credential_token"),
    Index("ix_credential_namespace", "namespace_id", "created_at"),
    comment="API tokens, stored as SHA-256, bound to one namespace and a queue allow-list",
    **MYSQL_TABLE,
)

# --- revision p0002: archive controls (issue 16, docs/archive-controls.md) ----------------------

archive_controls = Table(
    "orbit_archive_controls",
    metadata,
    Column("control", Str(16), nullable=False, comment="pause, throttle or window"),
    Column(
        "scope",
        Ascii(96),
        nullable=False,
        comment="canonical scope key storage/namespace/kind, * for any",
    ),
    Column("storage_id", Id16(), nullable=True, comment="NULL = every storage"),
    Column("namespace_id", Id16(), nullable=True, comment="NULL = every namespace"),
    Column("kind", Str(16), nullable=True, comment="NULL = every kind"),
    Column("max_roots_per_second", UInt(), nullable=True, comment="throttle only"),
    Column(
        "windows",
        Ascii(255),
        nullable=False,
        server_default=text("''"),
        comment="window only: HH:MM-HH:MM[,...] UTC",
    ),
    Column("reason", Str(255), nullable=False, server_default=text("''")),
    Column("actor", Str(128), nullable=False),
    Column("since", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("control", "scope"),
    CheckConstraint("control IN ('pause','throttle','window')", name="ck_archive_control_kind"),
    comment="operator controls of archive jobs: pauses, throttles, run windows",
    **MYSQL_TABLE,
)

control_generation = Table(
    "orbit_archive_control_generation",
    metadata,
    Column("id", SmallInteger(), nullable=False, autoincrement=False, comment="always 1"),
    Column("generation", UBigInt(), nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("id"),
    comment="bumped by every control change; a missing row reads as 0",
    **MYSQL_TABLE,
)

throttle_buckets = Table(
    "orbit_archive_throttle_buckets",
    metadata,
    Column("scope", Ascii(96), nullable=False, comment="the throttle's scope key"),
    Column(
        "ready_at",
        DateTime6(),
        nullable=False,
        comment="database time when the roots taken so far are paid for",
    ),
    PrimaryKeyConstraint("scope"),
    comment="shared rate budget of a throttle, taken by compare-and-set",
    **MYSQL_TABLE,
)

job_waits = Table(
    "orbit_archive_job_waits",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("job_id", Id16(), nullable=False),
    Column("reason", Str(16), nullable=False),
    Column("since", DateTime6(), nullable=True, comment="start of the open wait, NULL = none"),
    Column(
        "waited_us",
        UBigInt(),
        nullable=False,
        server_default=text("0"),
        comment="microseconds of the closed waits",
    ),
    Column("updated_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("namespace_id", "job_id", "reason"),
    CheckConstraint(
        "reason IN ('paused','throttled','db_load','replica_lag','window','replica_diverged')",
        name="ck_archive_wait_reason",
    ),
    comment="seconds an archive job waited before a claim, by reason",
    **MYSQL_TABLE,
)

heartbeat = Table(
    "orbit_archive_heartbeat",
    metadata,
    Column("id", SmallInteger(), nullable=False, autoincrement=False, comment="always 1"),
    Column("beat_at", DateTime6(), nullable=False, comment="primary clock at the last beat"),
    PrimaryKeyConstraint("id"),
    comment="written by the tick on the primary, read back on a replica",
    **MYSQL_TABLE,
)

# Revision p0005 (issue 24 item 4): how far a job's final step re-verified its chain, so that
# the step resumes across claims instead of reading every file within one lease.
job_checks = Table(
    "orbit_archive_job_checks",
    metadata,
    Column("namespace_id", Id16(), nullable=False),
    Column("job_id", Id16(), nullable=False),
    Column("batches", UInt(), nullable=False, comment="the confirmed chain it belongs to"),
    Column("last_sha256", Hex64(), nullable=False, comment="the confirmed chain's tail"),
    Column("checked", UInt(), nullable=False, comment="files 0..checked-1 re-verified"),
    Column("link", Hex64(), nullable=False, comment="SHA-256 of file checked-1"),
    Column("roots", UBigInt(), nullable=False, comment="roots of files 0..checked-1"),
    Column("bytes", UBigInt(), nullable=False, comment="bytes of files 0..checked-1"),
    Column("last_settled", Ascii(40), nullable=False, server_default=text("''")),
    Column("last_id", Ascii(32), nullable=False, server_default=text("''")),
    Column("manifest_sha256", Hex64(), nullable=False),
    Column("updated_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("namespace_id", "job_id"),
    comment="progress of an archive job's final re-verification, written under its lease",
    **MYSQL_TABLE,
)

# Revision p0007 (issue 27): retired storages and namespaces (docs/operations.md "Retiring a
# storage or a namespace"). A row per retired one; nothing else of it changes, except that a
# retired namespace's state is DISABLED.
RETIREMENT_KINDS = ("storage", "namespace")
retirements = Table(
    "orbit_retirements",
    metadata,
    Column("target_kind", Str(16), nullable=False, comment="storage or namespace"),
    Column("target_id", Id16(), nullable=False, comment="the storage's or namespace's id"),
    Column("reason", Str(500), nullable=False, comment="why, one line"),
    Column("retired_by", Str(128), nullable=False, comment="the operator"),
    Column("retired_at", DateTime6(), nullable=False, server_default=utc_now_default()),
    PrimaryKeyConstraint("target_kind", "target_id"),
    CheckConstraint("target_kind IN ('storage','namespace')", name="ck_retirement_kind"),
    comment="retired archive storages and namespaces: out of lists and gauges, no new work",
    **MYSQL_TABLE,
)

# Revision p0012 (issue 30 item 3): the beat leader. Several `orbit beat` processes may run; the
# one holding this lease publishes the ticks (docs/operations.md "Several beats").
beat_leaders = Table(
    "orbit_beat_leaders",
    metadata,
    Column("name", Ascii(64), nullable=False, comment="the schedule led: always 'beat'"),
    Column("holder", Ascii(255), nullable=False, comment="host:pid of the leader"),
    Column("lease_id", Id16(), nullable=False, comment="random per beat process"),
    Column("epoch", UBigInt(), nullable=False, comment="+1 at every change of leader"),
    Column("lease_until", DateTime6(), nullable=False, comment="database clock"),
    Column("acquired_at", DateTime6(), nullable=False, comment="when this leader took over"),
    Column("last_tick_at", DateTime6(), nullable=True, comment="last tick the leader sent"),
    PrimaryKeyConstraint("name"),
    comment="the beat leader's lease (one row per schedule)",
    **MYSQL_TABLE,
)
