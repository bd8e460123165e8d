"""One ``/v1/realtime`` session: its settings, input audio buffer, conversation and the
response running, driven by the client's events (``routes_realtime`` has the protocol)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.websockets import WebSocket, WebSocketState

from mstar.api import realtime as ev
from mstar.api.errors import ApiError, validation_error
from mstar.api.protocol import ChatCompletionRequest
from mstar.api.sampling import request_sampling, resolve_sampling
from mstar.server.realtime_conversation import RATE, Conversation, Item, Part, new_id, truncated
from mstar.server.realtime_response import Response, ResponsePlan, error_event, run_response
from mstar.server.realtime_transcription import transcribe, transcription_request
from mstar.server.realtime_vad import Vad, vad_available
from mstar.server.routes_chat import check_chat_request
from mstar.server.runtime import ServerRuntime
from mstar.server.strict_json import UnsafeValue, loads_strict

_DEFAULT_VAD = ev.ServerVad(type="server_vad")


class Session:
    def __init__(self, rt: ServerRuntime, ws: WebSocket, max_buffer_s: float) -> None:
        self.rt, self.ws = rt, ws
        self.id, self.conversation_id = new_id("sess"), new_id("conv")
        adapter = rt.adapter
        self.speaks = bool(adapter.chat_audio and adapter.audio_signal)
        self.instructions: str | None = None
        self.modalities = ["audio"] if self.speaks else ["text"]
        self.voice = adapter.audio_voice(None, "session.audio.output.voice") if self.speaks else None
        self.max_output_tokens: int | str = "inf"
        self.sampling: dict[str, Any] = {}  # M*'s sampling fields, as a chat request takes them
        self.turn_detection: ev.ServerVad | None = _DEFAULT_VAD if vad_available() else None
        self.vad: Vad | None = None
        self.transcription: ev.InputTranscription | None = None  # None: committed audio is not transcribed
        self.transcribing: set[asyncio.Task] = set()
        self.conversation = Conversation()
        self.buffer = bytearray()  # committed audio leaves it
        self.buffer_start_ms = 0  # of the buffer's first byte, in session audio time
        self.max_buffer_bytes = int(max_buffer_s * RATE) * 2
        self.speech_start_ms: int | None = None
        self.speech_item_id: str | None = None
        self.response: Response | None = None
        self._send_lock = asyncio.Lock()

    # ---- sending ------------------------------------------------------------------------
    async def send(self, event: dict[str, Any]) -> None:
        event = {"event_id": new_id("event"), **event}
        async with self._send_lock:
            if self.ws.application_state == WebSocketState.CONNECTED:
                with contextlib.suppress(RuntimeError):  # closed between the check and the send
                    await self.ws.send_text(json.dumps(event, separators=(",", ":")))

    async def error(self, exc: ApiError, event_id: str | None = None) -> None:
        await self.send({"type": "error", **error_event(exc, event_id)})

    def public(self) -> dict[str, Any]:
        td = self.turn_detection.model_dump(include={"type", "threshold", "prefix_padding_ms", "silence_duration_ms",
                                                     "create_response", "interrupt_response"}) if self.turn_detection else None
        fmt = {"type": "audio/pcm", "rate": RATE}
        return {
            "type": "realtime", "object": "realtime.session", "id": self.id, "model": self.rt.model_name,
            "output_modalities": self.modalities, "instructions": self.instructions or "",
            "audio": {"input": {"format": fmt, "turn_detection": td,
                                "transcription": self.transcription.model_dump(exclude_none=True) if self.transcription else None, "noise_reduction": None},
                      "output": {"format": fmt, "voice": self.voice, "speed": 1.0}},
            "max_output_tokens": self.max_output_tokens, "tools": [], "tool_choice": "auto", **self.sampling,
        }

    # ---- receiving ----------------------------------------------------------------------
    async def handle(self, text: str | None) -> None:
        """One client message; every problem is an ``error`` event (the session stays)."""
        if text is None:
            return await self.error(ApiError(400, "send JSON text frames; binary frames are not read", code="invalid_message"))
        try:
            body = loads_strict(text.encode())
        except json.JSONDecodeError as exc:
            if isinstance(exc, UnsafeValue):
                return await self.error(ApiError(400, exc.message, param=exc.param, code="invalid_value"))
            return await self.error(ApiError(400, f"the message is not valid JSON: {exc}", code="invalid_json"))
        event_id = body.get("event_id") if isinstance(body, dict) and isinstance(body.get("event_id"), str) else None
        try:
            event = ev.parse_event(body)
        except KeyError as exc:
            known = ", ".join(ev.CLIENT_EVENTS)
            return await self.error(ApiError(400, f"unknown event type {exc.args[0]!r}; this server takes {known}",
                                             param="type", code="invalid_event"), event_id)
        except ValidationError as exc:
            return await self.error(validation_error(exc), event_id)
        try:
            await self._dispatch(event)
        except ApiError as exc:
            await self.error(exc, event_id)

    async def _dispatch(self, event: BaseModel) -> None:
        if isinstance(event, ev.SessionUpdate):
            self._update(event.session)
            await self.send({"type": "session.updated", "session": self.public()})
        elif isinstance(event, ev.AudioAppend):
            await self._append(event.audio)
        elif isinstance(event, ev.AudioCommit):
            await self._commit(len(self.buffer))
        elif isinstance(event, ev.AudioClear):
            self._drop(len(self.buffer))
            await self.send({"type": "input_audio_buffer.cleared"})
        elif isinstance(event, ev.ItemCreate):
            await self._create_item(event)
        elif isinstance(event, ev.ItemTruncate):
            await self._truncate(event)
        elif isinstance(event, ev.ItemDelete):
            del self.conversation.items[self.conversation.index(event.item_id, "item_id")]
            await self.send({"type": "conversation.item.deleted", "item_id": event.item_id})
        elif isinstance(event, ev.ItemRetrieve):  # as OpenAI: the item with its transcripts (never audio data)
            item = self.conversation.items[self.conversation.index(event.item_id, "item_id")]
            await self.send({"type": "conversation.item.retrieved", "item": item.public()})
        elif isinstance(event, ev.ResponseCreate):
            self.start_response(event.response or ev.ResponseConfig())
        elif isinstance(event, ev.ResponseCancel):
            await self._cancel(event.response_id)

    # ---- session settings ---------------------------------------------------------------
    def _update(self, cfg: ev.SessionConfig) -> None:
        if cfg.model is not None and cfg.model not in self.rt.served_names():
            raise ApiError(400, f"this session talks to {self.rt.model_name!r}; open another one for {cfg.model!r}", param="session.model")
        modalities = cfg.output_modalities or self.modalities
        output = cfg.audio.output if cfg.audio and cfg.audio.output else None
        voice = output.voice if output and output.voice is not None else self.voice
        if output and output.speed not in (None, 1.0):
            raise ApiError(400, "speed control is not implemented; omit speed or use 1.0", param="session.audio.output.speed", code="not_implemented")
        sampling = {**self.sampling, **{k: v for k, v in (cfg.model_extra or {}).items() if k in ev.SAMPLING_FIELDS}}
        max_tokens = cfg.max_output_tokens if cfg.max_output_tokens is not None else self.max_output_tokens
        # The settings must make a valid chat request: checked now, not when a response fails.
        self._plan(self.instructions, modalities, voice, max_tokens, sampling, None, "session.")
        inp = cfg.audio.input if cfg.audio and cfg.audio.input else None
        if inp is not None and inp.transcription is not None:
            transcription_request(self.rt, inp.transcription)  # a bad setting fails now (changing nothing), not per item
        if inp is not None and "turn_detection" in inp.model_fields_set:
            if inp.turn_detection is not None and not vad_available():
                raise ApiError(400, "server_vad needs the silero-vad package (pip install 'mstar-core[vad]'); set turn_detection to null",
                               param="session.audio.input.turn_detection", code="vad_unavailable")
            self.turn_detection, self.vad = inp.turn_detection, None
        if inp is not None and "transcription" in inp.model_fields_set:
            self.transcription = inp.transcription
        if cfg.instructions is not None:
            self.instructions = cfg.instructions
        self.modalities, self.voice, self.sampling, self.max_output_tokens = modalities, voice, sampling, max_tokens

    def _plan(self, instructions: str | None, modalities: list[str], voice: str | None, max_tokens: int | str,
              sampling: dict[str, Any], messages: list[dict[str, Any]] | None, prefix: str) -> ResponsePlan:
        audio = "audio" in modalities
        if audio and not self.speaks:
            raise ApiError(400, f"model {self.rt.model_name!r} answers in text only; use output_modalities [\"text\"]",
                           param=f"{prefix}output_modalities")
        body: dict[str, Any] = {"model": self.rt.model_name, "messages": messages or [{"role": "user", "content": "x"}],
                                "max_tokens": None if max_tokens == "inf" else max_tokens, **sampling}
        if audio:
            body.update(modalities=["text", "audio"], audio={"voice": voice, "format": "pcm16"})
        try:
            req = ChatCompletionRequest(**body)
        except ValidationError as exc:
            raise validation_error(exc, prefix) from None
        try:
            check_chat_request(self.rt, req)
            resolve_sampling(self.rt.node_samplers, self.rt.adapter.sampling_node, request_sampling(req, max_tokens=("max_output_tokens", req.max_tokens)))
        except ApiError as exc:
            if exc.param == "audio.voice":
                exc.param = f"{prefix}audio.output.voice"
            elif exc.param and not exc.param.startswith(prefix):
                exc.param = prefix + exc.param
            raise
        return ResponsePlan(req, audio, voice if audio else None, max_tokens)

    # ---- input audio --------------------------------------------------------------------
    async def _append(self, data: str) -> None:
        try:
            pcm = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "audio: not valid base64", param="audio", code="invalid_value") from None
        if len(pcm) % 2:
            raise ApiError(400, "audio: PCM16 needs an even number of bytes", param="audio", code="invalid_value")
        if len(self.buffer) + len(pcm) > self.max_buffer_bytes:
            raise ApiError(400, f"the input audio buffer holds at most {self.max_buffer_bytes // 2 / RATE:g} s; commit or clear it",
                           param="audio", code="input_audio_buffer_full")
        self.buffer += pcm
        if self.turn_detection is None:
            return
        if self.vad is None:
            self.vad = await asyncio.to_thread(Vad, self.turn_detection)
        for event in await asyncio.to_thread(self.vad.feed, pcm):
            await self._vad_event(event.kind, event.ms)

    async def _vad_event(self, kind: str, ms: int) -> None:
        td = self.turn_detection
        assert td is not None
        if kind == "started":
            self.speech_start_ms, self.speech_item_id = ms, new_id("item")
            await self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": ms, "item_id": self.speech_item_id})
            if td.interrupt_response and self.response is not None:
                await self._cancel(None, "turn_detected")  # barge-in
            return
        await self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ms, "item_id": self.speech_item_id})
        start = max((self.speech_start_ms or 0) - td.prefix_padding_ms, self.buffer_start_ms)
        self._drop((start - self.buffer_start_ms) * RATE // 1000 * 2)  # the silence before the padding
        await self._commit(len(self.buffer), self.speech_item_id)
        if td.create_response and self.response is None:
            self.start_response(ev.ResponseConfig())

    def _drop(self, nbytes: int) -> None:
        del self.buffer[:nbytes]
        self.buffer_start_ms += nbytes // 2 * 1000 // RATE

    async def _commit(self, nbytes: int, item_id: str | None = None) -> None:
        if nbytes < RATE // 10 * 2:  # OpenAI's minimum: 100 ms
            raise ApiError(400, f"the input audio buffer holds {nbytes // 2 * 1000 // RATE} ms; commit at least 100 ms of audio",
                           param="input_audio_buffer", code="input_audio_buffer_commit_empty")
        pcm = bytes(self.buffer[:nbytes])
        self._drop(nbytes)
        item = Item(item_id or new_id("item"), "user", [Part("input_audio", pcm=pcm)])
        previous = self.conversation.add(item)
        await self.send({"type": "input_audio_buffer.committed", "item_id": item.id, "previous_item_id": previous})
        await self._announce(item, previous)
        if self.transcription is not None:
            task = asyncio.create_task(transcribe(self.rt, self.transcription, item.parts[0], item.id, self.send))
            self.transcribing.add(task)
            task.add_done_callback(self.transcribing.discard)

    async def _announce(self, item: Item, previous: str | None) -> None:
        """A complete item joined the conversation: ``created`` (beta name, kept), then GA's
        ``added`` and ``done`` (nothing more will change it but a transcription)."""
        for kind in ("conversation.item.created", "conversation.item.added", "conversation.item.done"):
            await self.send({"type": kind, "previous_item_id": previous, "item": item.public()})

    # ---- conversation -------------------------------------------------------------------
    async def _create_item(self, event: ev.ItemCreate) -> None:
        item_in = event.item
        allowed = {"user": ("input_text", "input_audio"), "system": ("input_text",), "assistant": ("output_text", "output_audio", "text", "audio")}[item_in.role]
        parts: list[Part] = []
        for j, p in enumerate(item_in.content):
            where = f"item.content.{j}"
            if p.type not in allowed:
                raise ApiError(400, f"{where}.type: a {item_in.role} item takes {', '.join(allowed[:2])} content", param=f"{where}.type")
            if p.type == "input_audio":
                if not self.rt.adapter.serves("transcription"):
                    raise ApiError(400, f"model {self.rt.model_name!r} takes no audio", param=f"{where}.type")
                try:
                    pcm = base64.b64decode(p.audio or "", validate=True)
                except (binascii.Error, ValueError):
                    raise ApiError(400, f"{where}.audio: not valid base64 PCM16", param=f"{where}.audio", code="invalid_value") from None
                if not pcm or len(pcm) % 2 or len(pcm) > self.max_buffer_bytes:
                    raise ApiError(400, f"{where}.audio: base64 PCM16 (24 kHz mono) of at most {self.max_buffer_bytes // 2 / RATE:g} s",
                                   param=f"{where}.audio", code="invalid_value")
                parts.append(Part("input_audio", pcm=pcm, transcript=p.transcript))
            elif p.type in ("input_text", "output_text", "text"):
                parts.append(Part("output_text" if item_in.role == "assistant" else "input_text", text=p.text or ""))
            else:  # an assistant's audio: its transcript is what the model said
                parts.append(Part("output_audio", transcript=p.transcript or ""))
        item = Item(item_in.id or new_id("item"), item_in.role, parts)
        previous = self.conversation.add(item, event.previous_item_id)
        await self._announce(item, previous)

    async def _truncate(self, event: ev.ItemTruncate) -> None:
        item = self.conversation.items[self.conversation.index(event.item_id, "item_id")]
        if item.role != "assistant" or event.content_index >= len(item.parts) or item.parts[event.content_index].type != "output_audio":
            raise ApiError(400, "only an assistant item's audio content can be truncated", param="content_index")
        part = item.parts[event.content_index]
        played = event.audio_end_ms * RATE // 1000
        if played > part.samples:
            raise ApiError(400, f"audio_end_ms {event.audio_end_ms} is past the audio's end ({part.samples * 1000 // RATE} ms)", param="audio_end_ms")
        part.transcript = truncated(part.transcript or "", played / part.samples if part.samples else 1.0)
        part.samples = played
        await self.send({"type": "conversation.item.truncated", "item_id": item.id, "content_index": event.content_index,
                         "audio_end_ms": event.audio_end_ms})

    # ---- responses ----------------------------------------------------------------------
    def start_response(self, cfg: ev.ResponseConfig) -> None:
        if self.response is not None:
            raise ApiError(400, f"response {self.response.id} is still in progress; cancel it or wait for response.done",
                           code="conversation_already_has_active_response")
        if not self.conversation.items:
            raise ApiError(400, "the conversation is empty; add an item (or commit audio) first", code="conversation_empty")
        output = cfg.audio.output if cfg.audio and cfg.audio.output else None
        sampling = {**self.sampling, **{k: v for k, v in (cfg.model_extra or {}).items() if k in ev.SAMPLING_FIELDS}}
        instructions = cfg.instructions if cfg.instructions is not None else self.instructions
        plan = self._plan(instructions, cfg.output_modalities or self.modalities,
                          output.voice if output and output.voice is not None else self.voice,
                          cfg.max_output_tokens if cfg.max_output_tokens is not None else self.max_output_tokens,
                          sampling, self.conversation.messages(instructions), "response.")
        plan.metadata, plan.in_conversation = cfg.metadata, cfg.conversation != "none"
        resp = Response(new_id("resp"), plan)
        self.response = resp
        resp.task = asyncio.create_task(run_response(self.rt, resp, self.conversation, self.conversation_id, self.send))
        resp.task.add_done_callback(lambda _: self._ended(resp))

    def _ended(self, resp: Response) -> None:
        if self.response is resp:
            self.response = None

    async def _cancel(self, response_id: str | None, reason: str = "client_cancelled") -> None:
        resp = self.response
        if resp is None or (response_id is not None and response_id != resp.id):
            raise ApiError(400, "no response in progress" + (f" with id {response_id!r}" if response_id else ""),
                           param="response_id" if response_id else None, code="response_cancel_not_active")
        if resp.task is not None and resp.cancel_reason is None:
            resp.cancel_reason = reason
            resp.task.cancel()
            await asyncio.gather(resp.task, return_exceptions=True)  # its events before the next ones

    async def close(self) -> None:
        resp = self.response
        tasks = [*self.transcribing, *([resp.task] if resp is not None and resp.task is not None else [])]
        for task in tasks:
            task.cancel()  # their engine requests are aborted: the blocks freed
        await asyncio.gather(*tasks, return_exceptions=True)
