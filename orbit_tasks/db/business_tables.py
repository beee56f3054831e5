"""Business (application) database schema: the seed tables and the sender's own two tables.

``sender_outbox`` and ``sender_jobs`` are ``seeds/sender_outbox.sql`` exactly (revision b0001,
never changed). Revision b0002 adds the sender's own tables: ``sender_pruned`` (what a pruned
outbox row promised, so that ``enqueue()`` answers as before the prune; docs/sender.md
"Retention") and ``sender_resolutions`` (who marked a REVIEW row as handled, and why); revision
b0003 adds ``sender_holds`` (a queue the platform asked to wait, honoured by every sender
process; docs/sender.md "Retry-After holds the queue"). Not part
of the platform migrations. The two MySQL-only CHECK expressions get SQLite variants
(``ddl_if``); everything else is one definition.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    CheckConstraint,
    Column,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    UniqueConstraint,
)

from orbit_tasks.db.types import MYSQL, Ascii, DateTime6, Digest32, JsonText, Str, UBigInt, UInt

metadata = MetaData()
_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB"}


def _on_mysql(ddl: Any, target: Any, bind: Any, **kw: Any) -> bool:
    return bool(kw["dialect"].name in MYSQL)


def _mysql_only(ck: CheckConstraint) -> CheckConstraint:
    return ck.ddl_if(callable_=cast(Any, _on_mysql))


def _sqlite_only(ck: CheckConstraint) -> CheckConstraint:
    return ck.ddl_if(dialect="sqlite")


sender_outbox = Table(
    "sender_outbox",
    metadata,
    Column(
        "namespace_id",
        Ascii(32, fixed=True),
        nullable=False,
        comment="固定目标命名空间，重启及换凭据不得改变",
    ),
    Column(
        "queue_id",
        Ascii(32, fixed=True),
        nullable=False,
        comment="固定目标队列，发送前核对当前授权及命名空间",
    ),
    Column(
        "operation_id",
        Ascii(32, fixed=True),
        nullable=False,
        comment="业务操作标识，同命名空间内唯一，调用方持久化后复用",
    ),
    Column(
        "idempotency_key",
        Ascii(128),
        nullable=False,
        comment="冻结平台提交键，由业务操作标识派生，禁止换键补发",
    ),
    Column(
        "request_json",
        JsonText(),
        nullable=False,
        comment="冻结任务提交正文，保留精确数字，不存认证凭据",
    ),
    Column(
        "request_digest",
        Digest32(),
        nullable=False,
        comment="冻结正文SHA256，防止同身份不同内容，非平台摘要算法",
    ),
    Column(
        "state",
        Ascii(16),
        nullable=False,
        comment="PENDING待发，SENDING领取中，ACCEPTED已受理，REVIEW需核查",
    ),
    Column("send_count", UInt(), nullable=False, comment="领取次数，包含领取后崩溃的次数，最多100"),
    Column(
        "lease_epoch", UBigInt(), nullable=False, comment="领取代次递增，旧发送器不能覆盖新代次结果"
    ),
    Column(
        "wake_at",
        DateTime6(),
        nullable=True,
        comment="待发下次时间或发送租约期限，终结后为空，UTC微秒",
    ),
    Column(
        "send_deadline_at",
        DateTime6(),
        nullable=False,
        comment="首次入库24小时后的发送截止，短于平台幂等保留窗口",
    ),
    Column(
        "last_code", Ascii(32), nullable=False, comment="最近稳定分类，不保存服务端错误正文或秘密"
    ),
    Column(
        "task_id",
        Ascii(32, fixed=True),
        nullable=True,
        comment="已确认的平台任务标识，只在ACCEPTED非空",
    ),
    Column(
        "receipt_json",
        JsonText(),
        nullable=True,
        comment="原受理回执，仅ACCEPTED非空，不代表当前执行结果",
    ),
    Column(
        "created_at", DateTime6(), nullable=False, comment="业务事务首次创建命令UTC时间，微秒精度"
    ),
    Column("updated_at", DateTime6(), nullable=False, comment="本地状态最近变化UTC时间，微秒精度"),
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
    _mysql_only(
        CheckConstraint(
            "send_deadline_at>created_at AND send_deadline_at<=TIMESTAMPADD(HOUR,24,created_at)",
            name="ck_sender_deadline",
        )
    ),
    # SQLite has no TIMESTAMPADD; julianday() works in whole milliseconds on both sides.
    _sqlite_only(
        CheckConstraint(
            "julianday(send_deadline_at)>julianday(created_at) AND "
            "julianday(send_deadline_at)<=julianday(created_at,'+24 hours')",
            name="ck_sender_deadline",
        )
    ),
    comment="业务事务Outbox，持久化原请求与有限重发状态，不承担业务恰好一次",
    **_MYSQL_TABLE,
)

sender_jobs = Table(
    "sender_jobs",
    metadata,
    Column(
        "namespace_id", Ascii(32, fixed=True), nullable=False, comment="与Outbox相同的命名空间范围"
    ),
    Column(
        "operation_id",
        Ascii(32, fixed=True),
        nullable=False,
        comment="本地业务操作标识，与Outbox同事务创建",
    ),
    Column(
        "source_ref",
        Str(512, charset="utf8mb4", collation="utf8mb4_0900_bin"),
        nullable=False,
        comment="待处理对象引用，首次入库后固定，不存对象正文或凭据",
    ),
    Column(
        "task_id",
        Ascii(32, fixed=True),
        nullable=True,
        comment="已确认的平台受理任务，为空不证明远端未受理",
    ),
    Column("created_at", DateTime6(), nullable=False, comment="业务记录创建UTC时间，微秒精度"),
    Column("updated_at", DateTime6(), nullable=False, comment="关联任务最近变化UTC时间，微秒精度"),
    PrimaryKeyConstraint("namespace_id", "operation_id"),
    comment="接入方示例业务记录，与待发请求及受理关联分别同事务保存",
    **_MYSQL_TABLE,
)

sender_pruned = Table(
    "sender_pruned",
    metadata,
    Column(
        "namespace_id", Ascii(32, fixed=True), nullable=False, comment="被清理Outbox行的命名空间"
    ),
    Column(
        "operation_id",
        Ascii(32, fixed=True),
        nullable=False,
        comment="被清理的业务操作标识，提交键由其派生",
    ),
    Column("queue_id", Ascii(32, fixed=True), nullable=False, comment="原目标队列，再次入库时比较"),
    Column(
        "request_digest", Digest32(), nullable=False, comment="原冻结正文SHA256，再次入库时比较"
    ),
    Column(
        "source_ref_digest",
        Digest32(),
        nullable=True,
        comment="清理时业务记录引用的SHA256，无业务记录时为空",
    ),
    Column("state", Ascii(16), nullable=False, comment="清理前状态，ACCEPTED或已处理的REVIEW"),
    Column("last_code", Ascii(32), nullable=False, comment="清理前最近稳定分类"),
    Column(
        "task_id",
        Ascii(32, fixed=True),
        nullable=True,
        comment="已受理的平台任务标识，只在ACCEPTED非空",
    ),
    Column("created_at", DateTime6(), nullable=False, comment="原行创建UTC时间"),
    Column("send_deadline_at", DateTime6(), nullable=False, comment="原行发送截止UTC时间"),
    Column("accepted_at", DateTime6(), nullable=True, comment="受理记录时间，只在ACCEPTED非空"),
    Column("pruned_at", DateTime6(), nullable=False, comment="清理UTC时间，与删除原行同一事务"),
    PrimaryKeyConstraint("namespace_id", "operation_id"),
    CheckConstraint(
        "(state='ACCEPTED' AND task_id IS NOT NULL AND accepted_at IS NOT NULL)\n"
        "OR (state='REVIEW' AND task_id IS NULL AND accepted_at IS NULL)",
        name="ck_sender_pruned_state",
    ),
    comment="已清理Outbox行的紧凑承诺，保证同一操作再次入库结果不变",
    **_MYSQL_TABLE,
)

sender_resolutions = Table(
    "sender_resolutions",
    metadata,
    Column("namespace_id", Ascii(32, fixed=True), nullable=False, comment="REVIEW行的命名空间"),
    Column("operation_id", Ascii(32, fixed=True), nullable=False, comment="REVIEW行的业务操作标识"),
    Column(
        "review_since",
        DateTime6(),
        nullable=False,
        comment="处理时REVIEW行的updated_at，行再变化后此处理失效",
    ),
    Column("last_code", Ascii(32), nullable=False, comment="处理时REVIEW原因"),
    Column(
        "resolved_by",
        Str(128, charset="utf8mb4", collation="utf8mb4_0900_bin"),
        nullable=False,
        comment="处理人，ORBIT_OPERATOR、ORBIT_ACTOR或系统用户",
    ),
    Column(
        "reason",
        Str(500, charset="utf8mb4", collation="utf8mb4_0900_bin"),
        nullable=False,
        comment="处理原因，由操作员填写",
    ),
    Column("resolved_at", DateTime6(), nullable=False, comment="处理UTC时间，数据库时钟"),
    PrimaryKeyConstraint("namespace_id", "operation_id"),
    comment="REVIEW行的人工处理记录，不改变Outbox行",
    **_MYSQL_TABLE,
)

sender_holds = Table(
    "sender_holds",
    metadata,
    Column("namespace_id", Ascii(32, fixed=True), nullable=False, comment="被暂停队列的命名空间"),
    Column("queue_id", Ascii(32, fixed=True), nullable=False, comment="被平台要求等待的队列"),
    Column(
        "held_until",
        DateTime6(),
        nullable=False,
        comment="此前不领取该队列，UTC数据库时钟，受上限及最早截止约束",
    ),
    Column("status", UInt(), nullable=False, comment="要求等待的HTTP状态，429或503"),
    Column("asked_seconds", UInt(), nullable=False, comment="Retry-After限幅后的秒数，向上取整"),
    Column("set_at", DateTime6(), nullable=False, comment="记录暂停的UTC数据库时间"),
    PrimaryKeyConstraint("namespace_id", "queue_id"),
    comment="平台Retry-After要求的队列暂停，所有发送进程共同遵守",
    **_MYSQL_TABLE,
)
