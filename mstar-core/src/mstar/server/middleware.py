"""ASGI middleware: request counting by status, API-key auth, and the body-size limit."""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Callable
from contextvars import ContextVar

import msgspec
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mstar.api.errors import ApiError
from mstar.server.metrics import MODEL_SCOPE_KEY, MetricFamilies

log = logging.getLogger("mstar.server")
_json = msgspec.json.Encoder()
# /docs, /redoc and /openapi.json need the key like the API itself.
_OPEN_PATHS = ("/health", "/metrics", "/version", "/")
_OPEN_PREFIXES = ("/static/",)  # the playground page's files: no data, the page asks for the key
# Whether this request may see /health's details (engine pids, exit and error text): always
# without an API key; with one, only when the request carries it (set by ``ApiKeyAuth``).
HEALTH_DETAIL: ContextVar[bool] = ContextVar("mstar_health_detail", default=True)


def _is_open(path: str) -> bool:
    return path in _OPEN_PATHS or path.startswith(_OPEN_PREFIXES)


async def send_error(send: Send, err: ApiError, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = _json.encode(err.body())
    await send({
        "type": "http.response.start",
        "status": err.status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(headers or [])],
    })
    await send({"type": "http.response.body", "body": body})


class RequestMetrics:
    """Counts every HTTP response by model, endpoint and status (outermost, so it sees all);
    the model is the one the route recorded in the scope, ``""`` when none. An exception
    no handler took, raised before the response started, is answered with a 500 here."""

    def __init__(self, app: ASGIApp, metrics: MetricFamilies, endpoints: set[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in self.endpoints else "other"

        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.count_request(scope.get(MODEL_SCOPE_KEY, ""), endpoint, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception as exc:
            if started:  # a response cut short: the server drops the connection
                raise
            # Answered here, not by Starlette's outermost handler: that one re-raises after
            # its 500, and uvicorn then closes the connection, resetting the client's next
            # request on it (keep-alive). A 500 is a whole response; the connection lives on.
            error_id = f"err-{uuid.uuid4().hex[:12]}"
            log.error("internal error %s on %s %s", error_id, scope.get("method"), path, exc_info=exc)
            message = f"internal server error; the server log has the details under {error_id}"
            await send_error(counting_send, ApiError(500, message, code="internal_error"))


class Draining:
    """While the server drains (SIGTERM): a new request gets a quick 503 with Retry-After
    and ``Connection: close`` instead of a refused socket; health and metrics still answer."""

    def __init__(self, app: ASGIApp, is_draining: Callable[[], bool], retry_after: Callable[[], int]) -> None:
        self.app = app
        self.is_draining = is_draining
        self.retry_after = retry_after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.is_draining() or scope["path"] in _OPEN_PATHS:
            return await self.app(scope, receive, send)
        err = ApiError(503, "the server is shutting down; retry on another instance or later", code="server_shutting_down")
        await send_error(send, err, [(b"retry-after", str(self.retry_after()).encode()), (b"connection", b"close")])


class ApiKeyAuth:
    """``Authorization: Bearer <key>`` on every endpoint but health, metrics, version and
    the playground page's files (the API docs and schema included); ``/health`` without the
    key answers its statuses only (``HEALTH_DETAIL``). WebSocket routes check the key
    themselves."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.key is None:
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if _is_open(scope["path"]):
            # Open, but /health shows its details (pids, error text) only with the key.
            HEALTH_DETAIL.set(scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key))
            return await self.app(scope, receive, send)
        if not header:
            err = ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        elif scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
            err = ApiError(401, "incorrect API key provided", code="invalid_api_key")
        else:
            return await self.app(scope, receive, send)
        await send_error(send, err, [(b"www-authenticate", b"Bearer")])


class BodyLimit:
    """413 for a body over ``max_bytes``: from Content-Length at once, or while reading a
    chunked body (before it is buffered whole)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, self._too_large())
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await send_error(send, self._too_large())

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body exceeds the limit of {self.max_bytes} bytes", code="request_too_large")


class _TooLarge(HTTPException):
    # An HTTPException so FastAPI's body reader re-raises it instead of calling it a 400.
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds the limit of {limit} bytes")
