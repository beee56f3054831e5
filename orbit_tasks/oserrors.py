"""One wording for operating-system errors in operator messages: ``<reason> (<ERRNO>)``.

Messages name the path and the errno, never file contents. A "path error" says that the path
itself cannot be used (read-only, not a directory, no such parent, no permission): the operator's
input, exit 2; anything else (no space, I/O error) may pass and is exit 1 (SPEC §9).
"""

from __future__ import annotations

import errno

PATH_ERRNOS = frozenset(
    {
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.ENOTDIR,
        errno.ENOENT,
        errno.EISDIR,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EEXIST,
    }
)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def errno_name(exc: OSError) -> str:
    """``"EROFS"`` for a read-only file system; ``"EIO"`` when the error carries no errno."""
    return errno.errorcode.get(exc.errno or 0, "EIO")


def reason(exc: OSError) -> str:
    """``"read-only file system (EROFS)"``: the system's text, lower-cased first letter, errno."""
    text = exc.strerror or errno_name(exc)
    return f"{text[:1].lower()}{text[1:]} ({errno_name(exc)})"


def is_path_error(exc: OSError) -> bool:
    return exc.errno in PATH_ERRNOS
