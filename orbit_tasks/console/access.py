"""Pure rules of the console's access (issue 29 item 4): roles, names, the hashed secret
(scrypt), session ids and their session-bound CSRF token, the Origin check. No I/O."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from enum import StrEnum

from orbit_tasks.errors import InvalidInput

#: scrypt cost of a stored secret (RFC 7914; 16 MiB of memory per check).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
SCHEME = "scrypt"
MIN_SECRET, MAX_SECRET = 12, 1024
SESSION_SECONDS = 8 * 3600
COOKIE = "orbit_console"
CSRF_FIELD = "csrf"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.@-]{0,63}$")


class Role(StrEnum):
    """What a person may do: read every page (viewer), or also act (operator)."""

    VIEWER = "viewer"
    OPERATOR = "operator"


def validate_user_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidInput(
            f"user name {name!r} is not allowed (1..64 characters of a-z 0-9 _ . @ -, "
            "starting with a letter or digit)"
        )
    return name


def validate_secret(secret: str) -> str:
    if not MIN_SECRET <= len(secret) <= MAX_SECRET:
        raise InvalidInput(
            f"the password is {len(secret)} characters long (allowed {MIN_SECRET}..{MAX_SECRET})"
        )
    if any(not ch.isprintable() for ch in secret):
        raise InvalidInput("the password holds a control character (allowed: printable text)")
    return secret


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(secret.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=2**26, dklen=32)


def hash_secret(secret: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$SALT$HASH`` (hex): what the users table stores, never the secret."""
    salt = secrets.token_bytes(16) if salt is None else salt
    digest = _scrypt(secret, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"{SCHEME}${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def check_secret(secret: str, stored: str) -> bool:
    """Does ``secret`` match the stored hash? Constant time; a malformed hash never matches."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != SCHEME:
            return False
        got = _scrypt(secret, bytes.fromhex(salt), int(n), int(r), int(p))
    except (ValueError, MemoryError):
        return False
    return hmac.compare_digest(got, bytes.fromhex(digest))


def new_session_id() -> str:
    return secrets.token_urlsafe(32)


def session_digest(session_id: str) -> str:
    """What the sessions table stores: the SHA-256 of the cookie, never the cookie."""
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


def csrf_token(session_id: str) -> str:
    """The CSRF token bound to a session: an HMAC of the session id (unknown to another site,
    which cannot read the HttpOnly cookie), sent in every form and checked on every POST."""
    return hmac.new(session_id.encode("utf-8"), b"orbit-console-csrf", hashlib.sha256).hexdigest()


def csrf_ok(session_id: str, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(csrf_token(session_id), sent)


def origin_ok(origin: str | None, host: str | None) -> bool:
    """A POST's ``Origin`` (when the browser sends one) must be this server itself."""
    if origin is None:
        return True  # no Origin header (older browsers, curl): the CSRF token decides
    if host is None:
        return False
    return origin in (f"http://{host}", f"https://{host}")


def may_act(role: Role) -> bool:
    return role is Role.OPERATOR
