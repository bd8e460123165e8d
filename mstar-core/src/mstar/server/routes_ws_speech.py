"""``WS /v1/audio/speech/stream``: text in as it arrives, speech out sentence by sentence.

Client → server (JSON text frames):

- ``{"type": "session", ...}``: speech settings for the sentences cut from now on: any
  ``/v1/audio/speech`` field but ``input``, ``response_format`` and ``stream_format``
  (``model``, ``voice``, ``seed``, ``temperature``, ``max_tokens``, ``sampling``, ...), and
  ``max_segment_chars`` (the splitter's limit, default 300). Optional: without it the
  served model's defaults apply. A voice the settings carry inline (a model's
  ``ApiAdapter.session_voice``, e.g. a Qwen3-TTS Base ``ref_audio``) is made once here,
  not again for every sentence.
- ``{"type": "text", "text": "..."}``: more text; each sentence it completes
  (``mstar.server.sentences`` has the rule) becomes one speech request.
- ``{"type": "flush"}``: the text so far ends (the rest becomes a last sentence); the
  server answers ``{"type": "flushed"}`` once every sentence before it has been spoken.
  The socket stays open for more text.

Server → client, for each sentence in order: ``{"type": "start", "segment", "text",
"request_id", "seed", "sample_rate", "encoding": "pcm_s16le", "channels": 1}``, binary
frames of 16-bit little-endian mono PCM, then ``{"type": "end", "segment",
"finish_reason", "samples"}``. A sentence that fails sends ``{"type": "error", "segment",
"error": {...}}`` then its ``end`` (``finish_reason: "error"``); a bad message gets an
``error`` without ``segment``; neither closes the socket. Closing the socket aborts every
sentence still generating and frees its cache.

Auth: with the API key set, the upgrade request needs ``Authorization: Bearer KEY`` or,
from a browser (which cannot set headers on a WebSocket), the subprotocols
``["mstar.speech", "mstar.bearer." + base64url(KEY)]`` (the server answers with
``mstar.speech``); else it is refused (HTTP 403).

vLLM-Omni's message names work too, chosen by the socket's first message (one socket speaks
one dialect; the other's messages are then an error): ``{"type": "session.config", ...}`` (the
settings above, plus ``stream_audio``: false, the default, sends each sentence's PCM as one
binary frame, true as it is generated; ``response_format`` may only be ``pcm``; refused while
text is buffered), ``{"type": "input.text", "text"}``, ``{"type": "input.done"}`` (a flush)
and ``{"type": "session.close"}`` (the server closes the socket). The server answers per
sentence ``{"type": "audio.start", "utterance_index", "sentence_index", "sentence_text",
"format": "pcm", "sample_rate", "request_id", "seed"}``, binary frames, ``{"type":
"audio.done", "utterance_index", "sentence_index", "total_bytes", "error"}``, and per
``input.done`` ``{"type": "session.done", "utterance_index", "total_sentences"}``, where an
utterance is the text between two ``input.done`` and ``sentence_index`` counts within it.
Errors are ``{"type": "error", "message", "code", "param"}`` (plus ``utterance_index`` and
``sentence_index`` for a sentence that failed, followed by its ``audio.done`` with
``error: true``). Same sentence splitting, seeds and limits as above.

Sentences generate at most ``LOOKAHEAD`` at a time (the next one starts while the current
one streams), and are sent strictly in order; at most ``MAX_WAITING`` wait to be spoken
(one cut beyond that fails alone with ``too_many_sentences``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from mstar.api.adapter import SPEECH, not_served
from mstar.api.audio import to_pcm16
from mstar.api.errors import ApiError, validation_error
from mstar.api.protocol import SpeechRequest
from mstar.api.sampling import request_sampling, resolve_sampling
from mstar.api.voices import EngineVoice, SessionVoice
from mstar.server.execution import Execution
from mstar.server.output_tracker import OutputTracker
from mstar.server.runtime import ServerRuntime
from mstar.server.sentences import SentenceSplitter
from mstar.server.strict_json import UnsafeValue, loads_strict
from mstar.server.voice_making import session_voice_made

log = logging.getLogger("mstar.server")

LOOKAHEAD = 2  # sentences generating (or waiting to be sent) at once
MAX_WAITING = 64  # sentences cut but not yet spoken; beyond it a sentence fails at once
_NOT_SETTINGS = ("input", "response_format", "stream_format")
# Close codes (RFC 6455): policy violation (bad key, endpoint not served), try again later.
_POLICY, _TRY_LATER = 1008, 1013
PROTOCOL, BEARER_PROTOCOL = "mstar.speech", "mstar.bearer."
OPENAI_KEY_PROTOCOL = "openai-insecure-api-key."  # the browser form of OpenAI's Realtime API


@dataclass
class _Segment:
    index: int
    text: str
    request: SpeechRequest
    voice: SessionVoice | None = None
    utterance: int = 0  # flushes before it (vLLM-Omni's utterance_index)
    in_utterance: int = 0  # its place in the utterance (sentence_index)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    holds_slot: bool = False  # a generation slot, freed by the sender once it is sent


@dataclass
class _Flush:
    """Marks a flush in the send order: ``segments`` sentences came before it."""

    segments: int
    utterance: int = 0
    in_utterance: int = 0  # sentences of the utterance it ends


OURS, VLLM = "mstar", "vllm-omni"
_KINDS = {OURS: ("session", "text", "flush"), VLLM: ("session.config", "input.text", "input.done", "session.close")}


class _Close(Exception):
    """``session.close``: the client is done."""


async def speech_stream(rt: ServerRuntime, ws: WebSocket, resolve: Callable[[str], ServerRuntime] | None = None, model: str | None = None) -> None:
    """``rt``: the model spoken unless ``model`` (the URL's ``?model=``) or the first session
    message names another; ``resolve`` finds a model by name on a server of several."""
    if not authorized(rt, ws):
        await ws.close(_POLICY)  # before accept: the upgrade is refused with 403
        return
    if model is not None and resolve is not None:
        try:
            rt = resolve(model)
        except ApiError as exc:
            await ws.accept(PROTOCOL if PROTOCOL in ws.scope.get("subprotocols", ()) else None)
            await _send_json(ws, {"type": "error", **exc.body()})
            await ws.close(_POLICY)
            return
    if rt.draining or not rt.healthy:
        await ws.close(_TRY_LATER)
        return
    await ws.accept(PROTOCOL if PROTOCOL in ws.scope.get("subprotocols", ()) else None)
    if not rt.adapter.serves(SPEECH) or not rt.adapter.audio_signal:
        await _send_json(ws, {"type": "error", **not_served(rt.model_name, "audio speech").body()})
        await ws.close(_POLICY)
        return
    await _Session(rt, ws, resolve).run()


def authorized(rt: ServerRuntime, ws: WebSocket) -> bool:
    """The API key (when set) as ``Authorization: Bearer KEY``, or as a subprotocol:
    ``mstar.bearer.`` + base64url(KEY), or OpenAI's ``openai-insecure-api-key.`` + KEY."""
    key = rt.config.api_key
    if not key:
        return True
    scheme, _, token = ws.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
        return True
    for proto in ws.scope.get("subprotocols", ()):
        if proto.startswith(OPENAI_KEY_PROTOCOL):
            return hmac.compare_digest(proto.removeprefix(OPENAI_KEY_PROTOCOL).encode(), key.encode())
        if proto.startswith(BEARER_PROTOCOL):
            encoded = proto.removeprefix(BEARER_PROTOCOL)
            try:
                given = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(given, key.encode())
    return False


class _Session:
    def __init__(self, rt: ServerRuntime, ws: WebSocket, resolve: Callable[[str], ServerRuntime] | None = None) -> None:
        self.rt = rt
        self.resolve = resolve
        self.ws = ws
        self.settings: dict[str, Any] = {"model": rt.model_name}
        self.splitter = SentenceSplitter()
        self.order: asyncio.Queue[_Segment | _Flush] = asyncio.Queue()
        self.slots = asyncio.Semaphore(LOOKAHEAD)
        self.count = 0  # sentences so far
        self.tasks: set[asyncio.Task] = set()  # sentences still generating
        self.sample_rate = rt.adapter.sample_rate or 16000
        self.voice: SessionVoice | None = None  # the settings' inline voice, made once
        self.dialect: str | None = None  # chosen by the first message
        self.stream_audio = False  # vLLM-Omni: binary frames as generated, or one per sentence
        self.utterance = 0  # flushes so far
        self.utterance_start = 0  # sentences before this utterance

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_in_order())
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if sender.done():  # the client stopped reading (send failed)
                    return
                try:
                    await self._handle(message)
                except ApiError as exc:
                    await self._error(exc)
        except WebSocketDisconnect:
            return
        except _Close:
            await self.ws.close(1000)
            return
        finally:
            # Closing (or losing) the socket aborts whatever still generates.
            tasks = [sender, *self.tasks]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- client messages ---------------------------------------------------------------
    async def _handle(self, message: dict[str, Any]) -> None:
        if message.get("text") is None:
            return await self._error(ApiError(400, "send JSON text frames; binary frames are not read", code="invalid_message"))
        try:
            body = loads_strict(message["text"].encode())
        except json.JSONDecodeError as exc:
            if isinstance(exc, UnsafeValue):  # valid JSON no message may carry: named as in a body
                return await self._error(ApiError(400, exc.message, param=exc.param, code="invalid_value"))
            return await self._error(ApiError(400, f"the message is not valid JSON: {exc}", code="invalid_json"))
        kind = body.get("type") if isinstance(body, dict) else None
        dialect = next((d for d, kinds in _KINDS.items() if kind in kinds), None)
        if dialect is None:
            expected = ", ".join(_KINDS[self.dialect or OURS]) if self.dialect else "session, text, flush (or vLLM-Omni's session.config, input.text, input.done)"
            return await self._error(ApiError(400, f"unknown message type {kind!r}; expected {expected}", param="type", code="invalid_message"))
        if self.dialect is None:
            self.dialect = dialect
        elif dialect != self.dialect:
            return await self._error(ApiError(400, f"this socket speaks {self.dialect} messages ({', '.join(_KINDS[self.dialect])}), "
                                              f"chosen by its first message; {kind!r} is the other dialect's", param="type", code="invalid_message"))
        kind = {"session.config": "session", "input.text": "text", "input.done": "flush"}.get(kind, kind)
        if kind == "session.close":
            raise _Close
        if kind == "text":
            text = body.get("text")
            if not isinstance(text, str):
                return await self._error(ApiError(400, "text: a string is required", param="text"))
            for sentence in self.splitter.feed(text):
                await self._speak(sentence)
        elif kind == "flush":
            for sentence in self.splitter.flush():
                await self._speak(sentence)
            self.order.put_nowait(_Flush(self.count, self.utterance, self.count - self.utterance_start))
            self.utterance, self.utterance_start = self.utterance + 1, self.count
        elif self.dialect == VLLM:
            await self._configure_vllm(body)
        else:
            await self._configure(body)

    async def _configure_vllm(self, body: dict[str, Any]) -> None:
        """vLLM-Omni's ``session.config``: ours, plus ``stream_audio``; PCM only."""
        if self.splitter.pending:
            return await self._error(ApiError(400, "session.config while text is buffered; send input.done first", code="invalid_message"))
        fields = dict(body)
        stream_audio = fields.pop("stream_audio", False)
        if not isinstance(stream_audio, bool):
            return await self._error(ApiError(400, "stream_audio must be a boolean", param="stream_audio"))
        fmt = fields.pop("response_format", "pcm")
        if fmt != "pcm":
            return await self._error(ApiError(400, "response_format: this server streams pcm only", param="response_format"))
        if await self._configure(fields):
            self.stream_audio = stream_audio

    async def _configure(self, body: dict[str, Any]) -> bool:
        """Applies a session message; False (after an error event) when it is refused."""
        fields = {k: v for k, v in body.items() if k != "type"}
        bad = [k for k in _NOT_SETTINGS if k in fields]
        if bad:
            return await self._error(ApiError(400, f"{bad[0]} is not a session setting (text comes in text messages; audio is always pcm_s16le)", param=bad[0]))
        max_chars = fields.pop("max_segment_chars", self.splitter.max_chars)
        if not isinstance(max_chars, int) or isinstance(max_chars, bool) or not 1 <= max_chars <= 4000:
            return await self._error(ApiError(400, "max_segment_chars must be an integer from 1 to 4000", param="max_segment_chars"))
        settings = {"model": self.rt.model_name, **fields}
        try:
            req = self._request(settings, "x")
            rt = self._model(req.model)
            # Sampling values are checked now, not first when a sentence fails.
            resolve_sampling(rt.node_samplers, rt.adapter.sampling_node, request_sampling(req, max_tokens=("max_tokens", req.max_tokens)))
        except ApiError as exc:
            return await self._error(exc)
        try:
            # A voice the settings carry inline (e.g. a reference clip) is made here, once,
            # not again for every sentence.
            voice = await rt.preprocess.session_voice(req, f"speechws-session-{id(self)}")
            if voice is not None:
                voice = await session_voice_made(rt, voice, "speechws-voice")
        except ApiError as exc:
            return await self._error(exc)
        if voice is not None:
            log.info("speech stream: made the session's voice once (%s)", ", ".join(voice.fields))
        self.rt, self.sample_rate = rt, rt.adapter.sample_rate or 16000
        self.settings = settings
        self.voice = voice
        self.splitter.max_chars = max_chars
        return True

    def _model(self, name: str) -> ServerRuntime:
        """The runtime of a session's ``model``: another of the server's models only before
        the first sentence (one socket speaks one model)."""
        if self.resolve is None or name in self.rt.served_names():
            self.rt.check_model(name)
            return self.rt
        rt = self.resolve(name)
        if self.count:
            raise ApiError(400, f"this stream already speaks {self.rt.model_name!r}; open another socket for {name!r}", param="model")
        if not rt.adapter.serves(SPEECH) or not rt.adapter.audio_signal:
            raise not_served(rt.model_name, "audio speech")
        return rt

    def _request(self, settings: dict[str, Any], text: str) -> SpeechRequest:
        try:
            return SpeechRequest(**settings, input=text, response_format="pcm")
        except ValidationError as exc:
            raise validation_error(exc) from None

    async def _speak(self, sentence: str) -> None:
        settings = self.settings
        if self.voice is not None:
            settings = {k: v for k, v in settings.items() if k not in self.voice.fields}
        seg = _Segment(self.count, sentence, self._request(settings, sentence), self.voice, self.utterance, self.count - self.utterance_start)
        self.count += 1
        if len(self.tasks) >= MAX_WAITING:
            err = ApiError(429, f"more than {MAX_WAITING} sentences are waiting to be spoken; send text as fast as it is spoken", code="too_many_sentences")
            self.order.put_nowait(seg)
            seg.events.put_nowait(err)
            return
        self.order.put_nowait(seg)
        task = asyncio.create_task(self._generate(seg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _error(self, exc: ApiError, seg: _Segment | None = None) -> None:
        if self.dialect == VLLM:  # vLLM-Omni's shape: the message at the top
            event: dict[str, Any] = {"type": "error", "message": exc.message, "code": exc.code, "param": exc.param}
            if seg is not None:
                event.update(utterance_index=seg.utterance, sentence_index=seg.in_utterance)
        else:
            event = {"type": "error", **exc.body()}
            if seg is not None:
                event["segment"] = seg.index
        await _send_json(self.ws, event)

    # ---- generation (one task per sentence) ------------------------------------------------
    async def _generate(self, seg: _Segment) -> None:
        """Runs one sentence and queues its events; the sender frees the slot."""
        ex = Execution(self.rt, SPEECH, prefix="speechws")  # arrival (for TTFA): the cut
        put = seg.events.put_nowait
        try:
            await self.slots.acquire()
            seg.holds_slot = True
            if self.rt.draining:
                raise ApiError(503, "the server is shutting down; reconnect to another instance or later", code="server_shutting_down")
            req = seg.request
            voice = seg.voice.voice if seg.voice is not None else None
            assert not isinstance(voice, EngineVoice)  # made in _configure
            await ex.start(req, request_sampling(req, max_tokens=("max_tokens", req.max_tokens)), [self.rt.adapter.audio_signal], voice)
            put({"type": "start", "segment": seg.index, "text": seg.text, "request_id": ex.request_id, "seed": ex.seed,
                 "sample_rate": self.sample_rate, "encoding": "pcm_s16le", "channels": 1})
            out = OutputTracker(self.rt, ex, self.rt.adapter.text_decoder())
            async for batch in ex.batches():
                _, audio = out.consume(batch)
                if audio:
                    put(to_pcm16(np.concatenate(audio)))
            out.finish()
            put({"type": "end", "segment": seg.index, "finish_reason": ex.finish_reason})
        except ApiError as exc:
            ex.finish_reason = "error"
            put(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            ex.finish_reason = "error"
            log.error("speech stream sentence %s failed", ex.request_id, exc_info=exc)
            put(ApiError(500, f"internal error; the server log has the details under request id {ex.request_id}", code="internal_error"))
        finally:
            ex.close()

    # ---- server messages, in order ---------------------------------------------------------
    async def _send_in_order(self) -> None:
        while True:
            item = await self.order.get()
            if isinstance(item, _Flush):
                if self.dialect == VLLM:
                    await _send_json(self.ws, {"type": "session.done", "utterance_index": item.utterance, "total_sentences": item.in_utterance})
                else:
                    await _send_json(self.ws, {"type": "flushed", "segments": item.segments})
                continue
            try:
                await self._send_segment(item)
            finally:
                if item.holds_slot:
                    self.slots.release()

    async def _send_segment(self, seg: _Segment) -> None:
        vllm = self.dialect == VLLM
        where = {"utterance_index": seg.utterance, "sentence_index": seg.in_utterance}
        held: list[bytes] = []  # vLLM-Omni without stream_audio: one frame per sentence
        samples = 0
        while True:
            event = await seg.events.get()
            if isinstance(event, bytes):
                samples += len(event) // 2
                if vllm and not self.stream_audio:
                    held.append(event)
                else:
                    await self.ws.send_bytes(event)
                continue
            failed = isinstance(event, ApiError)
            if failed:
                await self._error(event, seg)
            elif event["type"] == "start" and vllm:
                await _send_json(self.ws, {"type": "audio.start", **where, "sentence_text": event["text"], "format": "pcm",
                                           "sample_rate": event["sample_rate"], "request_id": event["request_id"], "seed": event["seed"]})
                continue
            elif event["type"] == "start":
                await _send_json(self.ws, event)
                continue
            if held and not failed:
                await self.ws.send_bytes(b"".join(held))
            if vllm:
                await _send_json(self.ws, {"type": "audio.done", **where, "total_bytes": samples * 2, "error": failed})
            elif failed:
                await _send_json(self.ws, {"type": "end", "segment": seg.index, "finish_reason": "error", "samples": samples})
            else:
                await _send_json(self.ws, {**event, "samples": samples})
            return


async def _send_json(ws: WebSocket, event: dict[str, Any]) -> None:
    if ws.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(RuntimeError):  # closed between the check and the send
            await ws.send_json(event)
