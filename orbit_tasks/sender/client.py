"""HTTP client of the platform API (``GET /v1/credential``, ``POST .../tasks``).

The credential's identity is cached for at most 60 s and dropped after any 401/403. Every
exchange is bounded in total (connect, send, status line, headers and body together), well below
the sender lease: the relay's pass limits rely on it (orbit_tasks/sender_limits.py). Nothing here
logs or returns the token, the request body or a raw exception text.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpcore
import httpx

from orbit_tasks.errors import InvalidInput, TransientError
from orbit_tasks.redaction import redact_url
from orbit_tasks.sender import policy

IDENTITY_MAX_AGE_SECONDS = 60.0
MAX_RESPONSE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Identity:
    credential_id: str
    namespace_id: str
    queue_ids: frozenset[str]
    fetched_at: float  # time.monotonic()
    namespace_name: str = ""


@dataclass(frozen=True)
class SendResult:
    """One POST: an HTTP status and (capped) body, or a transport failure without a response."""

    status: int | None
    body: bytes = b""
    retry_after: str | None = None
    transport: Literal["network", "timeout"] | None = None


class IdentityUnavailable(TransientError):
    """``GET /v1/credential`` failed; nothing is claimed until it works. ``status`` is the HTTP
    status when the API answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def make_timeout(total: float) -> httpx.Timeout:
    return httpx.Timeout(connect=min(5.0, total), read=total, write=total, pool=total)


# --- a total bound per exchange ---------------------------------------------------------------
# httpx's timeouts apply to each socket operation: a server trickling its status line or headers
# one byte at a time never trips them. The sending thread sets the end of its exchange here, and
# every connect/read/write of the network backend below waits at most until then.

_exchange = threading.local()


def _until_end(timeout: float | None, expired: type[Exception]) -> float | None:
    end: float | None = getattr(_exchange, "end", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise expired("the exchange passed its total time bound")
    return left if timeout is None else min(timeout, left)


class _BoundedStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _until_end(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _until_end(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        bounded = _until_end(timeout, httpcore.ConnectTimeout)
        return _BoundedStream(self._stream.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _BoundedBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _until_end(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, bounded, local_address, socket_options)
        return _BoundedStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        bounded = _until_end(timeout, httpcore.ConnectTimeout)
        return _BoundedStream(self._backend.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def bounded_transport(max_connections: int) -> httpx.HTTPTransport:
    """httpx's transport on a connection pool whose network backend honours the exchange's
    total bound (httpx has no public way to pass a backend; its ``_pool`` is replaced)."""
    transport = httpx.HTTPTransport(trust_env=False)
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False),
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=5.0,
        network_backend=_BoundedBackend(),
    )
    return transport


@contextmanager
def _bounded_exchange(total_seconds: float) -> Iterator[float]:
    """Bound every network operation of this thread until the exchange ends; yields its end."""
    end = time.monotonic() + total_seconds
    _exchange.end = end
    try:
        yield end
    finally:
        _exchange.end = None


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
            transport=transport or bounded_transport(max_connections),
        )
        self._lock = threading.Lock()
        self._identity: Identity | None = None
        self.shown_url = redact_url(base_url)  # for log lines: the password hidden
        # The whole exchange (not only each read) ends within this bound: a TIMEOUT after it.
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

    def identity_is_fresh(self, *, max_age: float = IDENTITY_MAX_AGE_SECONDS) -> bool:
        """True when :meth:`identity` answers from the cache (no HTTP exchange)."""
        with self._lock:
            cached = self._identity
        return cached is not None and time.monotonic() - cached.fetched_at < max_age

    def _fetch_identity(self) -> Identity:
        try:
            with _bounded_exchange(self._total_seconds):
                resp = self._http.get("/v1/credential", headers=self._auth())
        except httpx.TimeoutException:
            raise IdentityUnavailable("GET /v1/credential timed out") from None
        except httpx.HTTPError as exc:
            raise IdentityUnavailable(f"GET /v1/credential failed ({type(exc).__name__})") from None
        if resp.status_code != 200:
            raise IdentityUnavailable(
                f"GET /v1/credential answered HTTP {resp.status_code}", resp.status_code
            )
        try:
            doc = policy.parse_json_exact(resp.content.decode("utf-8"))
            ns = doc["namespace_id"]
            queues = frozenset(q["id"] for q in doc["queues"])
            cred = doc.get("credential_id", "")
            name = doc.get("namespace", "")
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, RecursionError):
            raise IdentityUnavailable("GET /v1/credential answered an unreadable body") from None
        if not policy.is_hex32(ns) or not all(policy.is_hex32(q) for q in queues):
            raise IdentityUnavailable("GET /v1/credential answered ids that are not 32 hex")
        name = name if isinstance(name, str) else ""
        return Identity(str(cred), ns, queues, time.monotonic(), namespace_name=name)

    # --- submission ------------------------------------------------------------------------

    def submit(self, namespace_id: str, queue_id: str, key: str, body: bytes) -> SendResult:
        """POST the frozen body bytes under the frozen key; never raises for HTTP/transport."""
        headers = self._auth()
        headers["Idempotency-Key"] = key
        headers["Content-Type"] = "application/json"
        url = f"/v1/namespaces/{namespace_id}/queues/{queue_id}/tasks"
        try:
            with _bounded_exchange(self._total_seconds) as end:
                request = self._http.build_request("POST", url, content=body, headers=headers)
                resp = self._http.send(request, stream=True)
                try:
                    chunks: list[bytes] = []
                    size = 0
                    for chunk in resp.iter_bytes():
                        if time.monotonic() > end:
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


def require_api(base_url: str, token: str | None, *, timeout_seconds: float) -> Identity:
    """The start check of ``orbit worker sender`` (issue 23, first use): the credential is set,
    ``ORBIT_API_URL`` is an http(s) URL and ``GET /v1/credential`` answers with this credential's
    identity within the HTTP bound. Anything else is :class:`InvalidInput` (exit 2), one line
    naming the variable and the URL with its password hidden, never the token."""
    shown = redact_url(base_url)
    if not token or not token.strip():
        raise InvalidInput(
            "ORBIT_API_TOKEN is not set; the sender worker needs a platform credential "
            "(create one with 'orbit credential create NAMESPACE')"
        )
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(
            f"ORBIT_API_URL {shown!r} is not an http:// or https:// URL of the platform API"
        )
    with PlatformClient(base_url, token, timeout_seconds=timeout_seconds) as client:
        try:
            return client.identity()
        except IdentityUnavailable as exc:
            if exc.status in (401, 403):
                raise InvalidInput(
                    f"ORBIT_API_TOKEN is not accepted by the platform API at {shown} "
                    f"(HTTP {exc.status}); use a token from 'orbit credential create NAMESPACE'"
                ) from None
            raise InvalidInput(
                f"ORBIT_API_URL {shown!r} does not answer as the platform API: {exc}"
            ) from None
