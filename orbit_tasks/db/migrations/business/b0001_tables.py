"""The business (sender) tables of revision b0001, frozen (SPEC §12).

A copy of ``orbit_tasks/db/business_tables.py`` as it was when b0001 was written:
``seeds/sender_outbox.sql`` exactly; only ``ck_sender_deadline`` has a SQLite variant
(``TIMESTAMPADD`` does not exist there). Never edit this file; a schema change is a new revision.
``tests/integration/test_migrations_frozen.py`` proves the live module still agrees with it.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    UniqueConstraint,
)

from orbit_tasks.db.migrations.frozen_0001 import BUSINESS_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import (
    ascii_str,
    datetime6,
    digest32,
    json_text,
    mysql_only,
    sqlite_only,
    ubigint,
    uint,
    varchar,
)

REVISION = "b0001"

metadata = MetaData()


def _id32(name: str, comment: str, nullable: bool = False) -> Column:
    return Column(name, ascii_str(32, fixed=True), nullable=nullable, comment=comment)


Table(
    "sender_outbox",
    metadata,
    _id32("namespace_id", "固定目标命名空间，重启及换凭据不得改变"),
    _id32("queue_id", "固定目标队列，发送前核对当前授权及命名空间"),
    _id32("operation_id", "业务操作标识，同命名空间内唯一，调用方持久化后复用"),
    Column(
        "idempotency_key",
        ascii_str(128),
        nullable=False,
        comment="冻结平台提交键，由业务操作标识派生，禁止换键补发",
    ),
    Column(
        "request_json",
        json_text(),
        nullable=False,
        comment="冻结任务提交正文，保留精确数字，不存认证凭据",
    ),
    Column(
        "request_digest",
        digest32(),
        nullable=False,
        comment="冻结正文SHA256，防止同身份不同内容，非平台摘要算法",
    ),
    Column(
        "state",
        ascii_str(16),
        nullable=False,
        comment="PENDING待发，SENDING领取中，ACCEPTED已受理，REVIEW需核查",
    ),
    Column("send_count", uint(), nullable=False, comment="领取次数，包含领取后崩溃的次数，最多100"),
    Column(
        "lease_epoch", ubigint(), nullable=False, comment="领取代次递增，旧发送器不能覆盖新代次结果"
    ),
    Column(
        "wake_at",
        datetime6(),
        nullable=True,
        comment="待发下次时间或发送租约期限，终结后为空，UTC微秒",
    ),
    Column(
        "send_deadline_at",
        datetime6(),
        nullable=False,
        comment="首次入库24小时后的发送截止，短于平台幂等保留窗口",
    ),
    Column(
        "last_code",
        ascii_str(32),
        nullable=False,
        comment="最近稳定分类，不保存服务端错误正文或秘密",
    ),
    _id32("task_id", "已确认的平台任务标识，只在ACCEPTED非空", nullable=True),
    Column(
        "receipt_json",
        json_text(),
        nullable=True,
        comment="原受理回执，仅ACCEPTED非空，不代表当前执行结果",
    ),
    Column(
        "created_at", datetime6(), nullable=False, comment="业务事务首次创建命令UTC时间，微秒精度"
    ),
    Column("updated_at", datetime6(), nullable=False, comment="本地状态最近变化UTC时间，微秒精度"),
    PrimaryKeyConstraint("namespace_id", "operation_id"),
    UniqueConstraint("namespace_id", "idempotency_key", name="uq_sender_identity"),
    Index("ix_sender_due", "namespace_id", "queue_id", "wake_at", "operation_id"),
    CheckConstraint("JSON_VALID(request_json)", name="ck_sender_document"),
    CheckConstraint("receipt_json IS NULL OR JSON_VALID(receipt_json)", name="ck_sender_receipt"),
    CheckConstraint("send_count<=100 AND lease_epoch=send_count", name="ck_sender_count"),
    CheckConstraint(
        "(state IN ('PENDING','SENDING') AND wake_at IS NOT NULL AND task_id IS NULL "
        "AND receipt_json IS NULL)\n"
        "OR (state='REVIEW' AND wake_at IS NULL AND task_id IS NULL AND receipt_json IS NULL)\n"
        "OR (state='ACCEPTED' AND wake_at IS NULL AND task_id IS NOT NULL "
        "AND receipt_json IS NOT NULL)",
        name="ck_sender_state",
    ),
    CheckConstraint("state<>'SENDING' OR lease_epoch>0", name="ck_sender_lease"),
    mysql_only(
        CheckConstraint(
            "send_deadline_at>created_at AND send_deadline_at<=TIMESTAMPADD(HOUR,24,created_at)",
            name="ck_sender_deadline",
        )
    ),
    sqlite_only(
        CheckConstraint(
            "julianday(send_deadline_at)>julianday(created_at) AND "
            "julianday(send_deadline_at)<=julianday(created_at,'+24 hours')",
            name="ck_sender_deadline",
        )
    ),
    comment="业务事务Outbox，持久化原请求与有限重发状态，不承担业务恰好一次",
    **OPTS,
)

Table(
    "sender_jobs",
    metadata,
    _id32("namespace_id", "与Outbox相同的命名空间范围"),
    _id32("operation_id", "本地业务操作标识，与Outbox同事务创建"),
    Column(
        "source_ref",
        varchar(512, charset="utf8mb4", collation="utf8mb4_0900_bin"),
        nullable=False,
        comment="待处理对象引用，首次入库后固定，不存对象正文或凭据",
    ),
    _id32("task_id", "已确认的平台受理任务，为空不证明远端未受理", nullable=True),
    Column("created_at", datetime6(), nullable=False, comment="业务记录创建UTC时间，微秒精度"),
    Column("updated_at", datetime6(), nullable=False, comment="关联任务最近变化UTC时间，微秒精度"),
    PrimaryKeyConstraint("namespace_id", "operation_id"),
    comment="接入方示例业务记录，与待发请求及受理关联分别同事务保存",
    **OPTS,
)
