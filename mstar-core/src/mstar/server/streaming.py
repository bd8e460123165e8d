"""Streamed responses: SSE framing, and a streaming response that cleans up its request
on every way out (finished, client gone, error, never started)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

_json = msgspec.json.Encoder()
encode_json = _json.encode

SSE_DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    return b"data: " + _json.encode(payload) + b"\n\n"


def ndjson(payload: Any) -> bytes:
    return _json.encode(payload) + b"\n"


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
