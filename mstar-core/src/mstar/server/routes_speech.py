"""``POST /v1/audio/speech``: a whole file (wav, flac, pcm), chunked raw bytes
(``stream_format: "audio"``) or SSE events with base64 PCM deltas (``"sse"``)."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator

import numpy as np
from starlette.responses import Response
from starlette.types import Receive

from mstar.api.adapter import SPEECH, not_served
from mstar.api.audio import MEDIA_TYPES, encode_audio, streaming_wav_header, to_pcm16
from mstar.api.errors import ApiError
from mstar.api.protocol import SpeechRequest
from mstar.api.sampling import request_sampling
from mstar.server.execution import Execution
from mstar.server.output_tracker import OutputTracker
from mstar.server.runtime import ServerRuntime
from mstar.server.streaming import (
    IncompleteBody,
    ManagedStreamingResponse,
    abort_on_disconnect,
    ending_with_error,
    sse,
)

log = logging.getLogger("mstar.server")


async def speech(rt: ServerRuntime, req: SpeechRequest, receive: Receive) -> Response:
    adapter = rt.adapter
    rt.check_model(req.model)
    if not adapter.serves(SPEECH) or not adapter.audio_signal:
        raise not_served(req.model, "audio speech")
    if req.stream_format == "audio" and req.response_format == "flac":
        raise ApiError(400, "flac cannot be streamed; use response_format wav or pcm", param="response_format")
    sample_rate = adapter.sample_rate or 16000
    ex = Execution(rt, SPEECH, prefix="speech")
    await ex.start(req, request_sampling(req, max_tokens=("max_tokens", req.max_tokens)), [adapter.audio_signal])
    out = OutputTracker(rt, ex, adapter.text_decoder())
    headers = {"x-request-id": ex.request_id, "x-sample-rate": str(sample_rate)}
    if ex.seed is not None:
        headers["x-mstar-seed"] = str(ex.seed)
    if req.stream_format == "sse":
        body = ending_with_error(_sse(ex, out), ex, lambda exc: _sse_error_frames(ex, exc))
        return ManagedStreamingResponse(body, ex.close, media_type="text/event-stream", headers=headers)
    if req.stream_format == "audio":
        raw = _raw(ex, out, req.response_format, sample_rate)
        return ManagedStreamingResponse(raw, ex.close, media_type=MEDIA_TYPES[req.response_format], headers=headers)
    try:
        async with abort_on_disconnect(receive, ex.close):
            async for batch in ex.batches():
                out.consume(batch)
        out.finish()
    finally:
        ex.close()
    audio = np.concatenate(out.audio) if out.audio else np.zeros(0, np.float32)
    return Response(encode_audio(audio, sample_rate, req.response_format), media_type=MEDIA_TYPES[req.response_format], headers=headers)


async def _raw(ex: Execution, out: OutputTracker, fmt: str, sample_rate: int) -> AsyncIterator[bytes]:
    if fmt == "wav":
        yield streaming_wav_header(sample_rate)
    # Raw audio has no error channel: on a failure the chunked body ends without its last
    # chunk (an incomplete body, never a clean short clip); the log has the request id.
    try:
        async for batch in ex.batches():
            _, audio = out.consume(batch)
            if audio:
                yield to_pcm16(np.concatenate(audio))
        out.finish()
    except Exception as exc:
        ex.finish_reason = "error"
        log.warning("request %s failed mid-stream; cutting its raw audio body: %s", ex.request_id, exc)
        raise IncompleteBody(ex.request_id) from exc


async def _sse(ex: Execution, out: OutputTracker) -> AsyncIterator[bytes]:
    async for batch in ex.batches():
        _, audio = out.consume(batch)
        if audio:
            yield sse({"type": "speech.audio.delta", "audio": base64.b64encode(to_pcm16(np.concatenate(audio))).decode()})
    out.finish()
    if ex.finish_reason != "abort":
        yield sse({"type": "speech.audio.done", "finish_reason": ex.finish_reason, "seed": ex.seed})


def _sse_error_frames(ex: Execution, exc: ApiError) -> tuple[bytes, bytes]:
    """An error event, then the usual last event so a reader always sees the end."""
    return sse({"type": "error", **exc.body()}), sse({"type": "speech.audio.done", "finish_reason": "error", "seed": ex.seed})
