"""Chat completions with ``n`` > 1 (text output): one engine request per choice, see
``server.choices``; the response and stream chunks carry every choice by its index."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from mstar import __version__
from mstar.api.adapter import CHAT
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.api.sampling import request_sampling
from mstar.server.choices import (
    Choice,
    close_all,
    interleave,
    run_whole,
    seed_for_choice,
    start_all,
    start_text_choice,
    text_deltas,
    usage,
)
from mstar.server.runtime import ServerRuntime
from mstar.server.streaming import (
    SSE_DONE,
    ManagedStreamingResponse,
    abort_on_disconnect,
    ending_with_error,
    sse,
)
from mstar.server.text_output import finish_reason


async def chat_choices(rt: ServerRuntime, req: ChatCompletionRequest, receive: Receive) -> Response:
    """``req`` passed ``check_chat_request`` (``n`` within the adapter's ``max_n``)."""
    if req.wants_audio:
        raise ApiError(400, "n > 1 is supported for text output only", param="n")
    top = (req.top_logprobs or 0) if req.logprobs else None
    limit = ("max_completion_tokens", req.max_completion_tokens) if req.max_completion_tokens is not None else ("max_tokens", req.max_tokens)

    async def start(k: int) -> Choice:
        sampling = request_sampling(req, max_tokens=limit)
        seed_for_choice(sampling, req.seed, k)
        return await start_text_choice(rt, CHAT, "chatcmpl", req, sampling, k, top)

    choices = await start_all(req.n, start)
    ex = choices[0].ex
    head = {"id": ex.request_id, "created": int(time.time()), "model": rt.model_name,
            "system_fingerprint": f"mstar-{__version__}", "seed": ex.seed}
    headers = {"x-request-id": ex.request_id, **({"x-mstar-seed": str(ex.seed)} if ex.seed is not None else {})}
    if req.stream:
        body = ending_with_error(_stream(req, head, choices), ex, lambda exc: (sse(exc.body()), SSE_DONE))
        return ManagedStreamingResponse(body, lambda: close_all(choices), media_type="text/event-stream", headers=headers)
    try:
        async with abort_on_disconnect(receive, lambda: close_all(choices)):
            texts = await asyncio.gather(*(run_whole(c) for c in choices))
    finally:
        close_all(choices)
    body = {
        **head,
        "object": "chat.completion",
        "choices": [
            {"index": c.index, "message": {"role": "assistant", "content": text},
             "logprobs": {"content": c.out.logprobs.content, "refusal": None} if c.out.logprobs else None,
             "finish_reason": finish_reason(c.ex.finish_reason)}
            for c, text in zip(choices, texts, strict=True)
        ],
        "usage": usage(choices, req.n),
    }
    return JSONResponse(body, headers=headers)


async def _stream(req: ChatCompletionRequest, head: dict[str, Any], choices: list[Choice]) -> AsyncIterator[bytes]:
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(c: Choice, delta: dict[str, Any], entries: list[dict[str, Any]] | None = None, finish: str | None = None) -> bytes:
        logprobs = {"content": entries, "refusal": None} if entries else None
        return sse({**head, "choices": [{"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})

    async def frames(c: Choice) -> AsyncIterator[bytes]:
        yield chunk(c, {"role": "assistant", "content": ""})
        async for text, entries in text_deltas(c):
            yield chunk(c, {"content": text} if text else {}, entries)
        if c.ex.finish_reason != "abort":
            yield chunk(c, {}, None, finish_reason(c.ex.finish_reason))

    async for item in interleave([frames(c) for c in choices]):
        yield item
    if any(c.ex.finish_reason == "abort" for c in choices):
        return  # the client is gone
    if req.stream_options is not None and req.stream_options.include_usage:
        yield sse({**head, "choices": [], "usage": usage(choices, req.n)})
    yield SSE_DONE
