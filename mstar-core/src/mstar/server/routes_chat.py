"""``POST /v1/chat/completions``: text (and audio, where the model has it), whole or SSE.

Audio output (``modalities: ["text", "audio"]``) follows OpenAI's shapes. Whole:
``message.content`` is null and ``message.audio`` is ``{id, data, expires_at, transcript}``
with ``data`` the base64 of the whole clip in ``audio.format``. Streamed (``audio.format``
must be ``pcm16``, as OpenAI requires): after the role chunk, each batch of engine outputs
gives a ``delta.audio = {id, transcript}`` chunk for its text and then a
``delta.audio = {id, data}`` chunk (base64 16-bit PCM) for its audio, in the order the
engines produced them; then one ``delta.audio = {expires_at}`` update, the finish chunk and
``[DONE]``. The server keeps no audio for later turns, so ``expires_at`` is the response's
``created`` time.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from mstar import __version__
from mstar.api.adapter import CHAT, not_served
from mstar.api.audio import encode_audio, format_problem, to_pcm16
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.api.sampling import request_sampling
from mstar.sampling.params import MAX_TOP_LOGPROBS
from mstar.server.execution import Execution
from mstar.server.logprobs import LogprobAssembler, logprob_signals
from mstar.server.output_tracker import OutputTracker
from mstar.server.routes_chat_choices import chat_choices
from mstar.server.runtime import ServerRuntime
from mstar.server.streaming import (
    SSE_DONE,
    ManagedStreamingResponse,
    abort_on_disconnect,
    encode_json,
    ending_with_error,
    sse,
)
from mstar.server.text_output import finish_reason, stop_strings

SYSTEM_FINGERPRINT = f"mstar-{__version__}"


def check_chat_request(rt: ServerRuntime, req: ChatCompletionRequest) -> None:
    adapter = rt.adapter
    rt.check_model(req.model)
    if not adapter.serves(CHAT):
        raise not_served(req.model, "chat completions")
    if req.n < 1:
        raise ApiError(400, "n must be >= 1", param="n")
    if req.n > adapter.max_n:
        raise ApiError(400, f"n={req.n} is not supported: model {rt.model_name!r} returns at most {adapter.max_n} choice(s)", param="n")
    if (req.logprobs or req.top_logprobs) and not adapter.supports_logprobs:
        raise ApiError(400, f"model {rt.model_name!r} does not provide logprobs", param="logprobs")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs")
    if req.top_logprobs and not req.logprobs:
        raise ApiError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.wants_audio:
        check_audio_output(rt, req)


def check_audio_output(rt: ServerRuntime, req: ChatCompletionRequest) -> None:
    """``modalities`` / ``audio`` against what the model and the server can produce."""
    adapter = rt.adapter
    if not (adapter.chat_audio and adapter.audio_signal):
        raise ApiError(400, f"model {rt.model_name!r} has no audio output; use modalities [\"text\"]", param="modalities")
    fmt = req.audio.format if req.audio is not None else "wav"
    problem = format_problem(fmt, adapter.sample_rate or 16000)
    if problem:
        raise ApiError(400, problem, param="audio.format")
    if req.stream and fmt not in ("pcm16", "pcm"):
        raise ApiError(400, "streamed audio is sent as pcm16; set audio.format to \"pcm16\"", param="audio.format")
    voice = req.audio.voice_name if req.audio is not None else None
    library = getattr(rt, "voices", None)
    if voice is not None and adapter.creates_voices and library is not None and library.get(voice) is not None:
        return  # a saved voice: Execution loads it for the adapter
    adapter.audio_voice(voice, "audio.voice")


async def chat_completions(rt: ServerRuntime, req: ChatCompletionRequest, receive: Receive) -> Response:
    check_chat_request(rt, req)
    if req.n > 1:  # several choices, each its own engine request
        return await chat_choices(rt, req, receive)
    adapter = rt.adapter
    sampling = request_sampling(
        req,
        max_tokens=("max_completion_tokens", req.max_completion_tokens) if req.max_completion_tokens is not None else ("max_tokens", req.max_tokens),
    )
    signals = [s for s in (adapter.text_signal, adapter.audio_signal if req.wants_audio else None) if s]
    logprobs = None
    if adapter.supports_logprobs and req.logprobs:
        top = req.top_logprobs or 0
        sampling.set("logprobs", True)
        sampling.set("top_logprobs", top)
        signals += logprob_signals(adapter, top)
        logprobs = LogprobAssembler(adapter, top)
    ex = Execution(rt, CHAT, prefix="chatcmpl")
    await ex.start(req, sampling, signals)
    out = OutputTracker(rt, ex, adapter.text_decoder(), stop_strings(sampling.main.get("stop")), logprobs)
    if req.stream:
        body = ending_with_error(_stream(rt, req, ex, out), ex, _error_frames)
        return ManagedStreamingResponse(body, ex.close, media_type="text/event-stream", headers=_headers(ex, req))
    try:
        async with abort_on_disconnect(receive, ex.close):
            async for batch in ex.batches():
                out.consume(batch)
                if out.text.stopped:
                    ex.stop()
                    break
        tail = out.finish()
    finally:
        ex.close()
    return JSONResponse(_completion(rt, req, ex, out, tail), headers=_headers(ex, req))


def _headers(ex: Execution, req: ChatCompletionRequest) -> dict[str, str]:
    headers = {"x-request-id": ex.request_id, **({"x-mstar-seed": str(ex.seed)} if ex.seed is not None else {})}
    if req.wants_audio:
        headers["x-sample-rate"] = str(ex.rt.adapter.sample_rate or 16000)
    return headers


def _usage(ex: Execution, out: OutputTracker) -> dict[str, int]:
    prompt = ex.engine_request.prompt_tokens if ex.engine_request else 0
    return {"prompt_tokens": prompt, "completion_tokens": out.tokens, "total_tokens": prompt + out.tokens}


def _logprobs(out: OutputTracker) -> dict[str, Any] | None:
    if out.logprobs is None:
        return None
    out.logprobs.take()
    return {"content": out.logprobs.content, "refusal": None}


def _completion(rt: ServerRuntime, req: ChatCompletionRequest, ex: Execution, out: OutputTracker, tail: str) -> dict[str, Any]:
    text = out.text.text
    created = int(time.time())
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if req.wants_audio:
        fmt = req.audio.format if req.audio else "wav"
        audio = np.concatenate(out.audio) if out.audio else np.zeros(0, np.float32)
        message["content"] = None
        message["audio"] = {
            "id": f"audio-{ex.request_id}",
            "data": base64.b64encode(encode_audio(audio, rt.adapter.sample_rate or 16000, fmt)).decode(),
            "expires_at": created,  # kept for no later turn
            "transcript": text,
        }
    return {
        "id": ex.request_id,
        "object": "chat.completion",
        "created": created,
        "model": rt.model_name,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "seed": ex.seed,
        "choices": [{"index": 0, "message": message, "logprobs": _logprobs(out), "finish_reason": finish_reason(ex.finish_reason)}],
        "usage": _usage(ex, out),
    }


async def _stream(rt: ServerRuntime, req: ChatCompletionRequest, ex: Execution, out: OutputTracker) -> AsyncIterator[bytes]:
    base = {
        "id": ex.request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": rt.model_name,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "seed": ex.seed,
    }
    audio_id = f"audio-{ex.request_id}"

    # The hot path: the constant part of every chunk is encoded once per request.
    head = sse(base)[:-3] + b',"choices":[{"index":0,"delta":'
    plain_end = b',"logprobs":null,"finish_reason":null}]}\n\n'
    logprobs_end = b'},"finish_reason":null}]}\n\n'

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: list[dict[str, Any]] | None = None) -> bytes:
        if finish is None and not logprobs:
            return head + encode_json(delta) + plain_end
        if finish is None:
            return head + encode_json(delta) + b',"logprobs":{"content":' + encode_json(logprobs) + logprobs_end
        return sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    def deltas(text: str, audio: list[np.ndarray]) -> list[dict[str, Any]]:
        """The batch's deltas: text as content, or (audio out) a transcript delta, then
        its audio as one base64 pcm16 delta."""
        if not req.wants_audio:
            return [{"content": text}] if text else []
        found: list[dict[str, Any]] = []
        if text:
            found.append({"audio": {"id": audio_id, "transcript": text}})
        if audio:
            found.append({"audio": {"id": audio_id, "data": base64.b64encode(to_pcm16(np.concatenate(audio))).decode()}})
        return found

    yield chunk({"role": "assistant", "content": "" if not req.wants_audio else None})
    async for batch in ex.batches():
        text, audio = out.consume(batch)
        entries = out.logprobs.take() if out.logprobs is not None else None
        parts = deltas(text, audio) or ([{}] if entries else [])
        for i, delta in enumerate(parts):
            yield chunk(delta, logprobs=entries if i == 0 else None)
        if out.text.stopped:
            ex.stop()
            break
    for delta in deltas(out.finish(), []):  # the detokenizer's flush (e.g. a cut multi-byte character)
        yield chunk(delta)
    if ex.finish_reason == "abort":
        return  # the client is gone
    if req.wants_audio:
        yield chunk({"audio": {"expires_at": base["created"]}})
    yield chunk({}, finish_reason(ex.finish_reason))
    if req.stream_options is not None and req.stream_options.include_usage:
        yield sse({**base, "choices": [], "usage": _usage(ex, out)})
    yield SSE_DONE


def _error_frames(exc: ApiError) -> tuple[bytes, bytes]:
    return sse(exc.body()), SSE_DONE
