"""One ``/v1/realtime`` response: the conversation as a chat request, run as
``/v1/chat/completions`` runs a streamed one (same preprocessing, sampling, seeds and
output tracking), its outputs as OpenAI's ``response.*`` events.

Events, in order: ``response.created``; once the request runs in the engines,
``response.output_item.added``, ``conversation.item.created`` and (GA) ``conversation.item.added``
(the assistant item, ``in_progress``), ``response.content_part.added``; then per batch of engine outputs a
``response.output_audio_transcript.delta`` (or ``response.output_text.delta`` for a text
answer) and a ``response.output_audio.delta`` (base64 PCM16 24 kHz), in the order the engines
produced them; then the ``.done`` events, ``response.content_part.done``, ``conversation.item.done`` (the
item final), ``response.output_item.done`` and ``response.done`` with ``status``, ``usage``
(``realtime_usage``) and the seed.
A cancelled response (``response.cancel``, or speech starting with ``server_vad``) stops
at once: its request is aborted in the engines (its cache blocks freed), and what it said
so far stays in the conversation as an ``incomplete`` item.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mstar.api.adapter import CHAT
from mstar.api.audio import to_pcm16
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.api.sampling import request_sampling
from mstar.server.execution import Execution
from mstar.server.output_tracker import OutputTracker
from mstar.server.realtime_conversation import Conversation, Item, Part, new_id
from mstar.server.realtime_usage import AudioTokenCounter, response_usage
from mstar.server.runtime import ServerRuntime
from mstar.server.text_output import stop_strings

log = logging.getLogger("mstar.server")

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class ResponsePlan:
    """What one response runs: the chat request, and how its answer is shown."""

    request: ChatCompletionRequest
    audio: bool  # spoken (audio + transcript) or text
    voice: str | None
    max_output_tokens: int | str
    metadata: dict[str, str] | None = None
    in_conversation: bool = True  # ``conversation: "none"``: out of band


@dataclass
class Response:
    id: str
    plan: ResponsePlan
    cancel_reason: str | None = None  # set before the task is cancelled
    task: asyncio.Task | None = None
    item: Item | None = None
    previous_item_id: str | None = None  # the item before ``item`` in the conversation
    usage: dict[str, Any] | None = None
    seed: int | None = None
    status: str = "in_progress"
    details: dict[str, Any] | None = field(default=None)

    def public(self, conversation_id: str) -> dict[str, Any]:
        plan = self.plan
        return {
            "id": self.id, "object": "realtime.response", "status": self.status, "status_details": self.details,
            "output": [self.item.public()] if self.item is not None else [], "conversation_id": conversation_id if plan.in_conversation else None,
            "output_modalities": ["audio"] if plan.audio else ["text"], "max_output_tokens": plan.max_output_tokens,
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": plan.voice}},
            "usage": self.usage, "metadata": plan.metadata, "seed": self.seed,  # seed: M*'s, to reproduce it
        }


async def run_response(rt: ServerRuntime, resp: Response, conv: Conversation, conversation_id: str, send: Send) -> None:
    """Runs ``resp`` to its end (or its cancellation) and sends its events."""
    req = resp.plan.request
    await send({"type": "response.created", "response": resp.public(conversation_id)})
    ex = Execution(rt, CHAT, prefix="resp")
    out: OutputTracker | None = None
    frames = AudioTokenCounter(rt.adapter)
    try:
        adapter = rt.adapter
        sampling = request_sampling(req, max_tokens=("max_output_tokens", req.max_tokens))
        audio_signals = (adapter.audio_signal, adapter.audio_codes_signal) if resp.plan.audio else ()
        signals = [s for s in (adapter.text_signal, *audio_signals) if s]  # codes: only counted (usage)
        await ex.start(req, sampling, signals)
        resp.seed = ex.seed
        out = OutputTracker(rt, ex, adapter.text_decoder(), stop_strings(sampling.main.get("stop")))
        part = Part("output_audio" if resp.plan.audio else "output_text", transcript="" if resp.plan.audio else None,
                    text=None if resp.plan.audio else "")
        resp.item = Item(new_id("item"), "assistant", [part], status="in_progress")
        previous = resp.previous_item_id = conv.add(resp.item) if resp.plan.in_conversation else None
        where = {"response_id": resp.id, "item_id": resp.item.id, "output_index": 0, "content_index": 0}
        await send({"type": "response.output_item.added", "response_id": resp.id, "output_index": 0, "item": resp.item.public()})
        if resp.plan.in_conversation:
            await send({"type": "conversation.item.created", "previous_item_id": previous, "item": resp.item.public()})
            await send({"type": "conversation.item.added", "previous_item_id": previous, "item": resp.item.public()})
        await send({"type": "response.content_part.added", **where, "part": _part(part)})
        async for batch in ex.batches():
            text, audio = out.consume(batch)
            frames.feed(batch)
            await _deltas(send, where, part, text, audio)
            if out.text.stopped:
                ex.stop()
                break
        await _deltas(send, where, part, out.finish(), [])  # the detokenizer's flush
        resp.status = "completed" if ex.finish_reason != "length" else "incomplete"
        if resp.status == "incomplete":
            resp.details = {"type": "incomplete", "reason": "max_output_tokens"}
    except asyncio.CancelledError:
        if resp.cancel_reason is None:
            raise  # the session is closing: nobody to tell
        resp.status, resp.details = "cancelled", {"type": "cancelled", "reason": resp.cancel_reason}
    except ApiError as exc:
        resp.status, resp.details = "failed", {"type": "failed", "error": {"type": exc.type, "code": exc.code, "message": exc.message}}
        await send({"type": "error", **error_event(exc)})
    except Exception as exc:
        log.error("realtime response %s failed", ex.request_id, exc_info=exc)
        err = ApiError(500, f"internal error; the server log has the details under request id {ex.request_id}", code="internal_error")
        resp.status, resp.details = "failed", {"type": "failed", "error": {"type": err.type, "code": err.code, "message": err.message}}
        await send({"type": "error", **error_event(err)})
    finally:
        ex.close()  # aborts the request in the engines if it still runs: its blocks are freed
    counted = frames.signal is not None or not resp.plan.audio  # else the audio went out uncounted
    await _finish(resp, out, ex, frames.frames if counted else None, conversation_id, send)


async def _deltas(send: Send, where: dict[str, Any], part: Part, text: str, audio: list[np.ndarray]) -> None:
    if text and part.type == "output_audio":
        part.transcript = (part.transcript or "") + text
        await send({"type": "response.output_audio_transcript.delta", **where, "delta": text})
    elif text:
        part.text = (part.text or "") + text
        await send({"type": "response.output_text.delta", **where, "delta": text})
    if audio and part.type == "output_audio":
        pcm = to_pcm16(np.concatenate(audio))
        part.samples += len(pcm) // 2
        await send({"type": "response.output_audio.delta", **where, "delta": base64.b64encode(pcm).decode()})


async def _finish(resp: Response, out: OutputTracker | None, ex: Execution, frames: int | None, conversation_id: str, send: Send) -> None:
    item = resp.item
    if item is not None:
        part = item.parts[0]
        item.status = "completed" if resp.status == "completed" else "incomplete"
        where = {"response_id": resp.id, "item_id": item.id, "output_index": 0, "content_index": 0}
        if part.type == "output_audio":
            await send({"type": "response.output_audio.done", **where})
            await send({"type": "response.output_audio_transcript.done", **where, "transcript": part.transcript or ""})
        else:
            await send({"type": "response.output_text.done", **where, "text": part.text or ""})
        await send({"type": "response.content_part.done", **where, "part": _part(part)})
        if resp.plan.in_conversation:
            await send({"type": "conversation.item.done", "previous_item_id": resp.previous_item_id, "item": item.public()})
        await send({"type": "response.output_item.done", "response_id": resp.id, "output_index": 0, "item": item.public()})
    resp.usage = response_usage(ex.rt.adapter, ex.engine_request, out.tokens if out is not None else 0, frames)
    await send({"type": "response.done", "response": resp.public(conversation_id)})


def _part(part: Part) -> dict[str, Any]:
    if part.type == "output_audio":
        return {"type": "audio", "transcript": part.transcript or ""}
    return {"type": "text", "text": part.text or ""}


def error_event(exc: ApiError, event_id: str | None = None) -> dict[str, Any]:
    body = exc.body()["error"]
    return {"error": {**body, "event_id": event_id}}
