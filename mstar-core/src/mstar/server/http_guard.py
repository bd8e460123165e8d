"""Bounds on what one HTTP connection can hold before any route (or the API-key check)
runs: a request's headers must arrive within ``header_timeout_s`` and fit in
``max_header_bytes`` (uvicorn's h11 limit; larger: 400 and closed), and its body must
arrive within ``body_timeout_s`` (``BodyTimeout``: 408 and closed). A connection that sits
idle, or never sends the rest of a body no route read, is closed ``header_timeout_s``
after its last response, however slowly it trickles bytes."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol


def guarded_h11(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, event: Any) -> None:
            self._disarm_header_timer()  # the connection now belongs to the WebSocket protocol
            super().handle_websocket_upgrade(event)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served: the body timeout and the route take over
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


class BodyTimeout:
    """408 (and ``Connection: close``) for a request whose body has not fully arrived
    ``timeout_s`` after its headers; the route never sees a half body."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body_done = False
        timed_out = False

        async def timed_receive() -> Message:
            nonlocal body_done, timed_out
            if body_done:  # afterwards: waiting for a disconnect, as long as the response runs
                return await receive()
            left = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), max(left, 0.0))
            except TimeoutError:
                timed_out = True
                raise _BodyTimedOut(self.timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def closing_send(message: Message) -> None:
            if timed_out and message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, timed_receive, closing_send)


class _BodyTimedOut(HTTPException):
    # An HTTPException so FastAPI's body reader re-raises it (the app's handler answers 408).
    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, f"the request body did not arrive within {timeout_s:g}s")
