"""The business (sender) table added by revision b0003, frozen (SPEC §12).

A copy of ``sender_holds`` in ``orbit_tasks/db/business_tables.py`` as it was when b0003 was
written (types from ``frozen_0001.py``, unchanged). Never edit this file; a schema change is a
new revision. ``tests/integration/test_migrations_frozen.py`` proves the live module still agrees
with b0001 + b0002 + b0003.
"""

from __future__ import annotations

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, Table

from orbit_tasks.db.migrations.frozen_0001 import BUSINESS_TABLE_OPTIONS as OPTS
from orbit_tasks.db.migrations.frozen_0001 import ascii_str, datetime6, uint

REVISION = "b0003"

metadata = MetaData()

Table(
    "sender_holds",
    metadata,
    Column(
        "namespace_id", ascii_str(32, fixed=True), nullable=False, comment="被暂停队列的命名空间"
    ),
    Column("queue_id", ascii_str(32, fixed=True), nullable=False, comment="被平台要求等待的队列"),
    Column(
        "held_until",
        datetime6(),
        nullable=False,
        comment="此前不领取该队列，UTC数据库时钟，受上限及最早截止约束",
    ),
    Column("status", uint(), nullable=False, comment="要求等待的HTTP状态，429或503"),
    Column("asked_seconds", uint(), nullable=False, comment="Retry-After限幅后的秒数，向上取整"),
    Column("set_at", datetime6(), nullable=False, comment="记录暂停的UTC数据库时间"),
    PrimaryKeyConstraint("namespace_id", "queue_id"),
    comment="平台Retry-After要求的队列暂停，所有发送进程共同遵守",
    **OPTS,
)
