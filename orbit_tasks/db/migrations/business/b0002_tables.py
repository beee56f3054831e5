"""The business (sender) tables added by revision b0002, frozen (SPEC §12).

A copy of ``sender_pruned`` and ``sender_resolutions`` in ``orbit_tasks/db/business_tables.py``
as they were when b0002 was written (the column types of revision 0001 did not change, so they
come from ``frozen_0001.py``). The seed tables stay as b0001 made them. Never edit this file; a
schema change is a new revision. ``tests/integration/test_migrations_frozen.py`` proves the live
module still agrees with b0001 + b0002.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, MetaData, PrimaryKeyConstraint, Table

from orbit_tasks.db.migrations.frozen_0001 import BUSINESS_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import ascii_str, datetime6, digest32, varchar

REVISION = "b0002"

metadata = MetaData()


def _id32(name: str, comment: str, nullable: bool = False) -> Column:
    return Column(name, ascii_str(32, fixed=True), nullable=nullable, comment=comment)


Table(
    "sender_pruned",
    metadata,
    _id32("namespace_id", "被清理Outbox行的命名空间"),
    _id32("operation_id", "被清理的业务操作标识，提交键由其派生"),
    _id32("queue_id", "原目标队列，再次入库时比较"),
    Column(
        "request_digest", digest32(), nullable=False, comment="原冻结正文SHA256，再次入库时比较"
    ),
    Column(
        "source_ref_digest",
        digest32(),
        nullable=True,
        comment="清理时业务记录引用的SHA256，无业务记录时为空",
    ),
    Column("state", ascii_str(16), nullable=False, comment="清理前状态，ACCEPTED或已处理的REVIEW"),
    Column("last_code", ascii_str(32), nullable=False, comment="清理前最近稳定分类"),
    _id32("task_id", "已受理的平台任务标识，只在ACCEPTED非空", nullable=True),
    Column("created_at", datetime6(), nullable=False, comment="原行创建UTC时间"),
    Column("send_deadline_at", datetime6(), nullable=False, comment="原行发送截止UTC时间"),
    Column("accepted_at", datetime6(), nullable=True, comment="受理记录时间，只在ACCEPTED非空"),
    Column("pruned_at", datetime6(), nullable=False, comment="清理UTC时间，与删除原行同一事务"),
    PrimaryKeyConstraint("namespace_id", "operation_id"),
    CheckConstraint(
        "(state='ACCEPTED' AND task_id IS NOT NULL AND accepted_at IS NOT NULL)\n"
        "OR (state='REVIEW' AND task_id IS NULL AND accepted_at IS NULL)",
        name="ck_sender_pruned_state",
    ),
    comment="已清理Outbox行的紧凑承诺，保证同一操作再次入库结果不变",
    **OPTS,
)

Table(
    "sender_resolutions",
    metadata,
    _id32("namespace_id", "REVIEW行的命名空间"),
    _id32("operation_id", "REVIEW行的业务操作标识"),
    Column(
        "review_since",
        datetime6(),
        nullable=False,
        comment="处理时REVIEW行的updated_at，行再变化后此处理失效",
    ),
    Column("last_code", ascii_str(32), nullable=False, comment="处理时REVIEW原因"),
    Column(
        "resolved_by",
        varchar(128, charset="utf8mb4", collation="utf8mb4_0900_bin"),
        nullable=False,
        comment="处理人，ORBIT_OPERATOR、ORBIT_ACTOR或系统用户",
    ),
    Column(
        "reason",
        varchar(500, charset="utf8mb4", collation="utf8mb4_0900_bin"),
        nullable=False,
        comment="处理原因，由操作员填写",
    ),
    Column("resolved_at", datetime6(), nullable=False, comment="处理UTC时间，数据库时钟"),
    PrimaryKeyConstraint("namespace_id", "operation_id"),
    comment="REVIEW行的人工处理记录，不改变Outbox行",
    **OPTS,
)
