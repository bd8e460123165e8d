"""``WS /v1/realtime``: OpenAI's Realtime API (GA event names) for models that hear.

A model hears when it serves chat and transcription (its adapter takes audio in); it
answers in audio too when it speaks in chat (``chat_audio``), else in text. ``?model=``
picks the model (default: the first that hears). JSON text frames both ways; audio is
base64 PCM16 mono at 24 kHz both ways (the model's preprocessing resamples its input).

Client events: ``session.update``, ``input_audio_buffer.append`` / ``commit`` / ``clear``,
``conversation.item.create`` / ``truncate`` / ``delete`` / ``retrieve``, ``response.create``,
``response.cancel``. Server events: ``session.created`` / ``session.updated``,
``input_audio_buffer.committed`` / ``cleared`` / ``speech_started`` / ``speech_stopped``,
``conversation.item.created`` (beta) with GA's ``added`` / ``done``, ``truncated`` /
``deleted`` / ``retrieved``, ``conversation.item.input_audio_transcription.*`` (when the
session asks, ``realtime_transcription``), the ``response.*`` events (``realtime_response``;
usage in ``realtime_usage``) and ``error`` (OpenAI's shape, ``error.event_id`` naming the
client event; the session stays open).

Limits as elsewhere: the API key (``Authorization: Bearer KEY``, or the subprotocol
``openai-insecure-api-key.KEY`` from a browser); each response is admitted like a request
(a full server is an ``error`` event, code ``queue_full``); the input buffer holds at most
the model's ``max_audio_seconds`` (an append beyond it is an error, the buffer kept); a
session with no client event and no response running for ``mstar serve
--realtime-idle-timeout`` seconds (default: env ``MSTAR_REALTIME_IDLE_S``, else 600) is
closed (code 1000, after an ``error`` event ``session_idle_timeout``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from mstar.api.adapter import CHAT, TRANSCRIPTION
from mstar.api.errors import ApiError
from mstar.server.realtime_response import error_event
from mstar.server.realtime_session import Session
from mstar.server.routes_ws_speech import authorized
from mstar.server.runtime import ServerRuntime

_POLICY, _TRY_LATER = 1008, 1013  # close codes (RFC 6455)
PROTOCOL = "realtime"  # the subprotocol OpenAI's browser clients offer
MAX_BUFFER_S = 600.0


def hears(rt: ServerRuntime) -> bool:
    return rt.adapter.serves(CHAT) and rt.adapter.serves(TRANSCRIPTION)


async def realtime(runtimes: list[ServerRuntime], ws: WebSocket, resolve: Callable[[str], ServerRuntime], model: str | None) -> None:
    listening = [rt for rt in runtimes if hears(rt)]
    rt = listening[0] if listening else runtimes[0]
    if not authorized(rt, ws):
        await ws.close(_POLICY)  # before accept: the upgrade is refused with 403
        return
    offered = ws.scope.get("subprotocols", ())
    problem: ApiError | None = None
    try:
        rt = resolve(model) if model is not None else rt
    except ApiError as exc:
        problem = exc
    if problem is None and not hears(rt):
        names = ", ".join(repr(r.model_name) for r in listening) or "none"
        problem = ApiError(400, f"model {rt.model_name!r} takes no audio in; the realtime models here: {names}", param="model", code="model_not_supported")
    if problem is None and (rt.draining or not rt.healthy):
        await ws.close(_TRY_LATER)
        return
    await ws.accept(PROTOCOL if PROTOCOL in offered else None)
    if problem is not None:
        await ws.send_json({"type": "error", "event_id": "event_0", **error_event(problem)})
        await ws.close(_POLICY)
        return
    session = Session(rt, ws, min(rt.adapter.max_audio_seconds, MAX_BUFFER_S))
    await session.send({"type": "session.created", "session": session.public()})
    idle = rt.config.realtime_idle_s
    try:
        while True:
            try:
                message = await asyncio.wait_for(ws.receive(), idle)
            except TimeoutError:
                if session.response is not None:
                    continue  # listening to an answer is no idling
                await session.error(ApiError(408, f"no event for {idle:g} s; the session is closed", code="session_idle_timeout"))
                await ws.close(1000)
                return
            if message["type"] == "websocket.disconnect":
                return
            await session.handle(message.get("text"))
    except WebSocketDisconnect:
        return
    finally:
        await session.close()  # a response still running is aborted: its blocks are freed
