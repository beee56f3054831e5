"""The reference platform API (SPEC §8): FastAPI app factory ``create_app(engine)``.

The request body is read as raw bytes (bounded at 1 MiB while it streams in), checked with a
Decimal-safe parser and stored exactly as received. Database work runs in the thread pool.
Neither the ``Authorization`` token, the ``Idempotency-Key`` nor the body ever reaches a log line
or an error answer; unexpected exceptions are logged by class name only (driver messages can
carry SQL parameters).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import Depends, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orbit_tasks import __version__
from orbit_tasks.api import receipts, store
from orbit_tasks.api.receipts import MAX_BODY_BYTES, ApiProblem
from orbit_tasks.logs import log_action

log = logging.getLogger("orbit.api.app")

JSON = "application/json"
# /readyz gives up on the database after this long (a hung connection is "not ready" too).
READY_TIMEOUT_SECONDS = 3.0
# Error codes of the answers the routing itself gives (unknown path, wrong method, ...).
_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}


# --- documentation models (answers are written as exact bytes, not through these) -------------


class ErrorBody(BaseModel):
    error: str = Field(description="stable error code")
    message: str = Field(description="short text; never the token or the request body")


class QueueRef(BaseModel):
    id: str = Field(description="queue id, 32 lowercase hex")
    name: str


class CredentialIdentity(BaseModel):
    credential_id: str
    namespace_id: str
    namespace: str
    all_queues: bool = Field(description="true: every queue of the namespace is allowed")
    queues: list[QueueRef] = Field(description="the allow-list, or every queue when all_queues")


class Receipt(BaseModel):
    """Canonical JSON (sorted keys, no spaces); a replay returns the original bytes."""

    accepted_at: str = Field(description="platform clock, YYYY-MM-DDTHH:MM:SS.ffffffZ")
    idempotency_key: str
    namespace_id: str
    queue_id: str
    task_id: str


def _err(description: str, *codes: str) -> dict[str, Any]:
    return {
        "model": ErrorBody,
        "description": f"{description} (error: {', '.join(codes)})",
    }


_RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before retrying",
        "schema": {"type": "integer", "minimum": 1},
    }
}
_UNAVAILABLE = {
    **_err("database unavailable or busy; retry after Retry-After seconds", "unavailable"),
    "headers": _RETRY_AFTER,
}
# Every operation: a method this path does not serve is 405 (the Allow header lists those it does).
_METHOD_ERRORS: dict[int | str, dict[str, Any]] = {
    405: {
        **_err("method not allowed on this path", "method_not_allowed"),
        "headers": {
            "Allow": {"description": "methods this path serves", "schema": {"type": "string"}}
        },
    },
}
_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _err("missing, unknown or revoked bearer token", "unauthenticated"),
    **_METHOD_ERRORS,
    500: _err("unexpected server error", "internal"),
    503: _UNAVAILABLE,
}

_SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    201: {"model": Receipt, "description": "accepted: a new task was created"},
    200: {
        "model": Receipt,
        "description": "replay: the key was already accepted with the same body and queue; "
        "the original receipt bytes, header Idempotent-Replayed: true",
        "headers": {"Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}}},
    },
    400: _err(
        "bad Idempotency-Key (1..128 printable ASCII, no space at either end), or the body is "
        "not a JSON object (invalid UTF-8, invalid JSON, NaN/Infinity, duplicate keys)",
        "bad_idempotency_key",
        "bad_json",
        "bad_request",
    ),
    **_AUTH_ERRORS,
    403: _err(
        "the namespace is not the credential's (or is disabled), or the queue is not in its "
        "allow-list",
        "forbidden",
    ),
    404: _err("no such queue in the credential's namespace", "queue_not_found"),
    409: _err(
        "the Idempotency-Key was already used with another body or queue", "idempotency_conflict"
    ),
    413: _err(f"request body over {MAX_BODY_BYTES} bytes", "too_large"),
    415: _err(
        "Content-Type is not application/json (charset, if given, utf-8)",
        "unsupported_media_type",
    ),
}

_SUBMIT_EXTRA: dict[str, Any] = {
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": True,
            "description": "names one request (same body bytes, same queue) for 72 h",
            "schema": {
                "type": "string",
                "minLength": 1,
                "maxLength": receipts.MAX_KEY_LENGTH,
                "pattern": r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$",
            },
        }
    ],
    "requestBody": {
        "required": True,
        "description": "a JSON object, at most 1 MiB, stored byte-exact (numbers stay exact)",
        "content": {JSON: {"schema": {"type": "object", "additionalProperties": True}}},
    },
}


def _without_validation_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """This API never answers 422 (it reads headers and body itself): drop FastAPI's entries."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)
    return schema


def _problem(exc: ApiProblem) -> Response:
    return Response(exc.body(), status_code=exc.status, media_type=JSON, headers=exc.headers)


def _routing_problem(exc: StarletteHTTPException) -> ApiProblem:
    """Answers of the router itself (unknown path 404, wrong method 405) in the error shape."""
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    messages = {
        404: "no such path in this API (see /openapi.json)",
        405: "method not allowed on this path (see the Allow header)",
    }
    message = messages.get(exc.status_code, "request refused")
    return ApiProblem(exc.status_code, code, message, dict(exc.headers or {}))


async def _read_body(request: Request) -> bytes:
    """The raw body, refused with 413 as soon as it passes the limit."""
    receipts.content_length(request.headers.get("content-length"))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise receipts.too_large()
        chunks.append(chunk)
    return b"".join(chunks)


class _ContainErrors:
    """Turn any unexpected exception into a JSON 500 (or 503 for an unreachable database) and
    log its class name only: driver messages and tracebacks may hold SQL parameters (keys,
    bodies), so the exception is not re-raised to the server's error log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def _send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except ClientDisconnect:
            log_action(log, "api.request.disconnected")
            return
        except Exception as exc:
            if isinstance(exc, OperationalError):
                log_action(
                    log, "api.db.unavailable", logging.WARNING, error=type(exc.orig).__name__
                )
                problem = receipts.unavailable()
            else:
                log_action(log, "api.request.failed", logging.ERROR, error=type(exc).__name__)
                problem = ApiProblem(500, "internal", "unexpected server error")
            if not started:
                await _problem(problem)(scope, receive, send)


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(
        title="Orbit reference platform API",
        version=__version__,
        description=(
            "Accepts task submissions with an idempotency key (SPEC §8). Every error answer is "
            '`{"error": "<code>", "message": "<text>"}`. Ids are 32 lowercase hex characters; '
            "path segments {ns} and {queue} accept an id or a name."
        ),
    )
    app.add_middleware(_ContainErrors)
    bearer = HTTPBearer(auto_error=False, description="API token (orbit credential create)")

    @app.exception_handler(ApiProblem)
    async def _api_problem(_request: Request, exc: ApiProblem) -> Response:
        return _problem(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_problem(_request: Request, exc: StarletteHTTPException) -> Response:
        return _problem(_routing_problem(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_problem(_request: Request, _exc: RequestValidationError) -> Response:
        return _problem(ApiProblem(400, "bad_request", "request does not match the API"))

    def _token(auth: HTTPAuthorizationCredentials | None) -> str:
        if auth is None:
            raise receipts.unauthenticated()
        return receipts.bearer_token(f"{auth.scheme} {auth.credentials}")

    @app.get(
        "/healthz",
        tags=["meta"],
        summary="Liveness: the process serves requests (does not touch the database)",
        responses=_METHOD_ERRORS,
    )
    def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.get(
        "/readyz",
        tags=["meta"],
        summary="Readiness: the platform database answers (503 with Retry-After while not)",
        responses={**_METHOD_ERRORS, 503: _UNAVAILABLE},
    )
    async def readyz() -> Response:
        try:
            await asyncio.wait_for(
                run_in_threadpool(store.check_ready, engine), READY_TIMEOUT_SECONDS
            )
        except (DBAPIError, TimeoutError) as exc:
            error = type(exc.orig if isinstance(exc, DBAPIError) else exc).__name__
            log_action(log, "api.ready.failed", logging.WARNING, error=error)
            return _problem(receipts.unavailable("the platform database is not ready"))
        return JSONResponse({"ok": True})

    @app.get(
        "/v1/credential",
        tags=["credentials"],
        summary="Identity of the calling credential: namespace and allowed queues",
        response_model=CredentialIdentity,
        response_description="the credential's namespace and allowed queues",
        responses=_AUTH_ERRORS,
    )
    def get_credential(
        auth: HTTPAuthorizationCredentials | None = Depends(bearer),
    ) -> Response:
        doc = store.credential_identity(engine, _token(auth))
        return Response(receipts.canonical_json(doc).encode("utf-8"), media_type=JSON)

    @app.post(
        "/v1/namespaces/{ns}/queues/{queue}/tasks",
        tags=["tasks"],
        summary="Submit a task with an idempotency key",
        status_code=201,
        response_class=Response,
        responses=_SUBMIT_RESPONSES,
        openapi_extra=_SUBMIT_EXTRA,
    )
    async def submit_task(
        request: Request,
        ns: str = Path(description="namespace id (32 hex) or name"),
        queue: str = Path(description="queue id (32 hex) or name"),
        auth: HTTPAuthorizationCredentials | None = Depends(bearer),
    ) -> Response:
        receipts.check_content_type(request.headers.get("content-type"))
        raw = await _read_body(request)
        token = _token(auth)
        key = request.headers.get("idempotency-key")
        outcome = await run_in_threadpool(store.submit_task, engine, token, ns, queue, key, raw)
        headers = {"Idempotent-Replayed": "true"} if outcome.status == 200 else None
        return Response(
            outcome.receipt.encode("utf-8"),
            status_code=outcome.status,
            media_type=JSON,
            headers=headers,
        )

    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _without_validation_errors(default_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
