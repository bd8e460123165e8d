"""Transcribing a committed user audio item of a ``/v1/realtime`` session with the served
model, through the path of ``/v1/audio/transcriptions`` (the same request, preprocessing,
sampling and seeds): the audio as a 24 kHz WAV upload. Its text streams as
``conversation.item.input_audio_transcription.delta`` events, then ``.completed`` (with the
transcript and token usage) sets the item's ``transcript``; a failure is ``.failed``. It
runs beside any response, as OpenAI's does."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from mstar.api.adapter import TRANSCRIPTION
from mstar.api.errors import ApiError, validation_error
from mstar.api.realtime import SAMPLING_FIELDS, InputTranscription
from mstar.api.sampling import request_sampling
from mstar.api.transcription import TranscriptionRequest
from mstar.server.execution import Execution
from mstar.server.output_tracker import OutputTracker
from mstar.server.realtime_conversation import Part, wav_of
from mstar.server.runtime import ServerRuntime

log = logging.getLogger("mstar.server")
Send = Callable[[dict[str, Any]], Awaitable[None]]
PARAM = "session.audio.input.transcription."
_EXTRA = (*SAMPLING_FIELDS, "max_tokens")  # M*'s fields a transcription request takes


def transcription_request(rt: ServerRuntime, cfg: InputTranscription, pcm: bytes = b"\0\0") -> TranscriptionRequest:
    """The ``/v1/audio/transcriptions`` request for ``pcm``; a bad setting is a 400 naming it
    (checked at ``session.update`` with a dummy clip, so a commit never meets it)."""
    if cfg.model is not None and cfg.model not in rt.served_names():
        raise ApiError(400, f"transcription runs on this session's model {rt.model_name!r}; omit model or name it",
                       param=PARAM + "model", code="model_not_supported")
    extra = {k: v for k, v in (cfg.model_extra or {}).items() if k in _EXTRA}
    try:
        return TranscriptionRequest(model=rt.model_name, file=wav_of(pcm), filename="audio.wav", language=cfg.language,
                                    prompt=cfg.prompt, max_seconds=rt.adapter.max_audio_seconds, **extra)
    except ValidationError as exc:
        raise validation_error(exc, PARAM) from None


async def transcribe(rt: ServerRuntime, cfg: InputTranscription, part: Part, item_id: str, send: Send) -> None:
    where = {"item_id": item_id, "content_index": 0}
    ex = Execution(rt, TRANSCRIPTION, prefix="trsc")
    try:
        req = transcription_request(rt, cfg, part.pcm or b"")
        await ex.start(req, request_sampling(req, max_tokens=("max_tokens", req.max_tokens)), [rt.adapter.text_signal])
        out = OutputTracker(rt, ex, rt.adapter.text_decoder())
        async for batch in ex.batches():
            text, _ = out.consume(batch)
            if text:
                await send({"type": "conversation.item.input_audio_transcription.delta", **where, "delta": text})
        tail = out.finish()  # the detokenizer's flush
        if tail:
            await send({"type": "conversation.item.input_audio_transcription.delta", **where, "delta": tail})
    except ApiError as exc:
        return await _failed(send, where, exc)
    except Exception as exc:
        log.error("realtime transcription %s failed", ex.request_id, exc_info=exc)
        return await _failed(send, where, ApiError(500, f"internal error; the server log has the details under request id {ex.request_id}",
                                                   code="internal_error"))
    finally:
        ex.close()  # aborts it in the engines if the session closed meanwhile
    part.transcript = out.text.text
    prompt = ex.engine_request.prompt_tokens if ex.engine_request else 0
    audio = rt.adapter.prompt_audio_tokens(ex.engine_request) if ex.engine_request else None
    usage: dict[str, Any] = {"type": "tokens", "input_tokens": prompt, "output_tokens": out.tokens, "total_tokens": prompt + out.tokens}
    if audio is not None:
        usage["input_token_details"] = {"text_tokens": prompt - audio, "audio_tokens": audio}
    await send({"type": "conversation.item.input_audio_transcription.completed", **where, "transcript": part.transcript,
                "usage": usage, "seed": ex.seed})  # seed: M*'s, to reproduce it over /v1/audio/transcriptions


async def _failed(send: Send, where: dict[str, Any], exc: ApiError) -> None:
    body = exc.body()["error"]
    await send({"type": "conversation.item.input_audio_transcription.failed", **where,
                "error": {k: body.get(k) for k in ("type", "code", "message", "param")}})
