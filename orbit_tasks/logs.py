"""Structured logs with a stable ``action`` key (``archive.job.claimed``, ``sender.row.accepted``).

Fields are ids, counts, codes and states only: never tokens, request bodies or file contents.
"""

from __future__ import annotations

import json
import logging
from typing import Any


def log_action(
    logger: logging.Logger, action: str, level: int = logging.INFO, **fields: Any
) -> None:
    """Log one event as ``action`` plus JSON fields (bytes ids are rendered as hex)."""
    clean = {k: (v.hex() if isinstance(v, bytes | bytearray) else v) for k, v in fields.items()}
    logger.log(
        level,
        "%s %s",
        action,
        json.dumps(clean, sort_keys=True, default=str),
        extra={"action": action, "fields": clean},
    )
