"""HTTP client of the platform API (``GET /v1/credential``, ``POST .../tasks``).

The credential's identity is cached for at most 60 s and dropped after any 401/403. Timeouts are
explicit and well below the sender lease. Nothing here logs or returns the token, the request body
or a raw exception text.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Literal

import httpx

from orbit_tasks.errors import InvalidInput, TransientError
from orbit_tasks.sender import policy

IDENTITY_MAX_AGE_SECONDS = 60.0
MAX_RESPONSE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Identity:
    credential_id: str
    namespace_id: str
    queue_ids: frozenset[str]
    fetched_at: float  # time.monotonic()


@dataclass(frozen=True)
class SendResult:
    """One POST: an HTTP status and (capped) body, or a transport failure without a response."""

    status: int | None
    body: bytes = b""
    retry_after: str | None = None
    transport: Literal["network", "timeout"] | None = None


class IdentityUnavailable(TransientError):
    """``GET /v1/credential`` failed; nothing is claimed until it works."""


def make_timeout(total: float) -> httpx.Timeout:
    return httpx.Timeout(connect=min(5.0, total), read=total, write=total, pool=total)


class PlatformClient:
    """Thread-safe: one instance per process, shared by the relay's sending threads."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout_seconds: float,
        max_connections: int = 8,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not token:
            raise InvalidInput("ORBIT_API_TOKEN is not set; the sender needs a platform credential")
        self._token = token
        self._http = httpx.Client(
            base_url=base_url,
            timeout=make_timeout(timeout_seconds),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        )
        self._lock = threading.Lock()
        self._identity: Identity | None = None
        # httpx timeouts are per operation; a server trickling its answer byte by byte would
        # never trip them. The whole exchange is also bounded: once this much time has passed
        # the send is a TIMEOUT (worst case: this bound plus one read timeout).
        self._total_seconds = timeout_seconds

    def __repr__(self) -> str:  # never show the token
        return f"PlatformClient({self._http.base_url!s})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PlatformClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    # --- identity --------------------------------------------------------------------------

    def invalidate_identity(self) -> None:
        with self._lock:
            self._identity = None

    def identity(self, *, max_age: float = IDENTITY_MAX_AGE_SECONDS) -> Identity:
        """The credential's namespace and allowed queues (cached <= ``max_age`` seconds)."""
        with self._lock:
            cached = self._identity
        if cached is not None and time.monotonic() - cached.fetched_at < max_age:
            return cached
        fresh = self._fetch_identity()
        with self._lock:
            self._identity = fresh
        return fresh

    def _fetch_identity(self) -> Identity:
        try:
            resp = self._http.get("/v1/credential", headers=self._auth())
        except httpx.TimeoutException:
            raise IdentityUnavailable("GET /v1/credential timed out") from None
        except httpx.HTTPError as exc:
            raise IdentityUnavailable(f"GET /v1/credential failed ({type(exc).__name__})") from None
        if resp.status_code != 200:
            raise IdentityUnavailable(f"GET /v1/credential answered HTTP {resp.status_code}")
        try:
            doc = policy.parse_json_exact(resp.content.decode("utf-8"))
            ns = doc["namespace_id"]
            queues = frozenset(q["id"] for q in doc["queues"])
            cred = doc.get("credential_id", "")
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, RecursionError):
            raise IdentityUnavailable("GET /v1/credential answered an unreadable body") from None
        if not policy.is_hex32(ns) or not all(policy.is_hex32(q) for q in queues):
            raise IdentityUnavailable("GET /v1/credential answered ids that are not 32 hex")
        return Identity(str(cred), ns, queues, time.monotonic())

    # --- submission ------------------------------------------------------------------------

    def submit(self, namespace_id: str, queue_id: str, key: str, body: bytes) -> SendResult:
        """POST the frozen body bytes under the frozen key; never raises for HTTP/transport."""
        headers = self._auth()
        headers["Idempotency-Key"] = key
        headers["Content-Type"] = "application/json"
        url = f"/v1/namespaces/{namespace_id}/queues/{queue_id}/tasks"
        deadline = time.monotonic() + self._total_seconds
        try:
            request = self._http.build_request("POST", url, content=body, headers=headers)
            resp = self._http.send(request, stream=True)
            try:
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_bytes():
                    if time.monotonic() > deadline:
                        return SendResult(None, transport="timeout")
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        break
                data = b"".join(chunks)
            finally:
                resp.close()
        except httpx.TimeoutException:
            return SendResult(None, transport="timeout")
        except httpx.HTTPError:
            return SendResult(None, transport="network")
        return SendResult(resp.status_code, data, resp.headers.get("Retry-After"))
