"""How the ``orbit sender`` commands resolve NS, a namespace name or id (SPEC §9; the decision is
in docs/sender.md "Operators").

The business database stores 32-hex namespace ids only. A 32-hex NS is that id. A name is looked
up, in this order, in the platform database (``ORBIT_DATABASE_URL``; a SQLite file that does not
exist is not created for the lookup) and, when that is not available, in the identity of the
sender's credential (``GET /v1/credential`` at ``ORBIT_API_URL`` with ``ORBIT_API_TOKEN``), which
knows its own namespace's name. A value that cannot be a name (``""``) is :class:`InvalidInput`
(exit 2); an unknown name is :class:`NotFound` (exit 4); a name no source
could look up because a configured source is down is a :class:`TransientError` (exit 1).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from orbit_tasks.db.registry import platform_engine
from orbit_tasks.errors import NotFound, TransientError
from orbit_tasks.ids import is_hex_id
from orbit_tasks.platform import store as platform_store
from orbit_tasks.settings import Settings

_HINT = (
    "pass the 32-hex namespace id, or make the platform database (ORBIT_DATABASE_URL) or the "
    "sender's credential (ORBIT_API_URL + ORBIT_API_TOKEN) reachable"
)


def _platform_configured(settings: Settings) -> bool:
    url = make_url(settings.database_url)
    if url.get_backend_name() != "sqlite":
        return True
    database = url.database or ""
    return database not in ("", ":memory:") and Path(database).is_file()


def resolve_namespace_id(ref: str, settings: Settings) -> str:
    """The 32-hex id of namespace ``ref`` (a name or an id)."""
    if is_hex_id(ref):
        return ref.lower()
    platform_store.validate_name(ref, "namespace")  # "" or "a b": exit 2, no lookup
    down: list[str] = []
    unset: list[str] = []
    if _platform_configured(settings):
        try:
            with platform_engine().connect() as conn:
                return platform_store.resolve_namespace(conn, ref).id.hex()
        except NotFound:
            raise NotFound(
                f"namespace {ref!r} does not exist in the platform database (ORBIT_DATABASE_URL)"
            ) from None
        except DBAPIError as exc:
            down.append(f"the platform database is unavailable ({type(exc.orig).__name__})")
    else:
        unset.append("no platform database (ORBIT_DATABASE_URL)")
    if settings.api_token:
        # Imported here: httpx costs every other `orbit` command ~0.1 s of start-up.
        from orbit_tasks.sender.client import IdentityUnavailable, PlatformClient

        client = PlatformClient(
            settings.api_url,
            settings.api_token,
            timeout_seconds=settings.sender_http_timeout_seconds,
            max_connections=1,
        )
        try:
            with client:
                identity = client.identity()
        except IdentityUnavailable as exc:
            down.append(f"the credential's identity is unavailable ({exc})")
        else:
            if identity.namespace_name == ref:
                return identity.namespace_id
            raise NotFound(
                f"namespace {ref!r} is not the sender credential's namespace "
                f"{identity.namespace_name!r} ({identity.namespace_id}); {_HINT}"
            )
    else:
        unset.append("no ORBIT_API_TOKEN")
    reasons = "; ".join(down + unset)
    if down:
        raise TransientError(f"cannot look up namespace {ref!r}: {reasons}; {_HINT}")
    raise NotFound(f"namespace {ref!r} cannot be looked up here ({reasons}); {_HINT}")
