"""Streamed responses: SSE framing, the rule that a stream which fails after it started
still ends in its protocol (an error event, then the terminator), and a streaming
response that cleans up its request on every way out (finished, client gone, error,
never started)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from mstar.api.errors import ApiError

if TYPE_CHECKING:
    from mstar.server.execution import Execution

log = logging.getLogger("mstar.server")
_json = msgspec.json.Encoder()
encode_json = _json.encode

SSE_DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    return b"data: " + _json.encode(payload) + b"\n\n"


def ndjson(payload: Any) -> bytes:
    return _json.encode(payload) + b"\n"


class IncompleteBody(Exception):
    """Raised by a body with no in-band error channel (raw audio) to end the response
    without its last chunk: the client sees an incomplete body, not a complete short one."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"request {request_id} failed mid-stream; its response body was cut")


def internal_stream_error(request_id: str) -> ApiError:
    """What the client sees of a fault in our own code mid-stream (the log has the rest)."""
    return ApiError(500, f"internal error while streaming the response; the server log has the details under request id {request_id}", code="internal_error")


async def ending_with_error(
    body: AsyncIterator[bytes], ex: Execution, error_frames: Callable[[ApiError], Iterable[bytes]]
) -> AsyncIterator[bytes]:
    """``body``, and if it raises after the stream started: the request's error in the
    stream's own framing (``error_frames``: an error event and the terminator), logged with
    the request id and counted as finish reason ``error``. The request is freed by the
    response's ``on_close``, as on every other way out."""
    try:
        async for part in body:
            yield part
    except ApiError as exc:
        ex.finish_reason = "error"
        log.warning("request %s failed mid-stream (%d): %s", ex.request_id, exc.status, exc.message)
        for frame in error_frames(exc):
            yield frame
    except Exception:
        ex.finish_reason = "error"
        log.exception("request %s: internal error mid-stream", ex.request_id)
        for frame in error_frames(internal_stream_error(ex.request_id)):
            yield frame


@contextlib.asynccontextmanager
async def abort_on_disconnect(receive: Receive, on_disconnect: Callable[[], None]) -> AsyncIterator[None]:
    """While a whole (non-streamed) response is being computed: a client that leaves
    aborts its request at once instead of after generation ends."""

    async def watch() -> None:
        while True:  # the body is read already: what comes now is the disconnect
            if (await receive())["type"] == "http.disconnect":
                on_disconnect()
                return

    task = asyncio.ensure_future(watch())
    try:
        yield
    finally:
        task.cancel()


class ManagedStreamingResponse(StreamingResponse):
    """Calls ``on_close`` exactly once when the response ends for any reason. A client
    that disconnects is noticed at once (not at the next write), so its request is
    aborted even while the stream is idle."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._watch_disconnect(receive))
        try:
            with contextlib.suppress(OSError):  # the client went away mid-write
                await self.stream_response(send)
        finally:
            watcher.cancel()
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._on_close()
                return
