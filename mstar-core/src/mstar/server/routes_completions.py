"""``POST /v1/completions``: OpenAI's text completions, whole or SSE.

Each prompt × ``n`` is one choice (index ``prompt * n + j``, see ``server.choices``).
``echo`` prepends the prompt's text; ``logprobs: N`` returns the chosen token's logprob
and the top N alternatives per generated token (``text_offset`` counts the characters of
each token's text). Not supported, and answered with a 400: ``suffix``, ``best_of`` other
than ``n``, and ``echo`` together with ``logprobs`` (that needs prompt logprobs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import torch
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from mstar.api.adapter import COMPLETIONS, not_served
from mstar.api.errors import ApiError
from mstar.api.protocol import CompletionRequest
from mstar.api.sampling import request_sampling
from mstar.sampling.params import MAX_TOP_LOGPROBS
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

MAX_CHOICES = 64


def check_completion_request(rt: ServerRuntime, req: CompletionRequest) -> None:
    adapter = rt.adapter
    rt.check_model(req.model)
    if not adapter.serves(COMPLETIONS):
        raise not_served(req.model, "completions")
    prompts = req.prompts()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ApiError(400, "prompt must not be empty", param="prompt")
    if req.n < 1:
        raise ApiError(400, "n must be >= 1", param="n")
    if req.n * len(prompts) > MAX_CHOICES:
        raise ApiError(400, f"at most {MAX_CHOICES} choices (prompts × n) per request", param="n")
    if req.best_of is not None and req.best_of != req.n:
        raise ApiError(400, "best_of other than n is not supported", param="best_of")
    if req.suffix:
        raise ApiError(400, "suffix is not supported", param="suffix")
    if req.logprobs is not None:
        if not adapter.supports_logprobs:
            raise ApiError(400, f"model {rt.model_name!r} does not provide logprobs", param="logprobs")
        if not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
            raise ApiError(400, f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="logprobs")
        if req.echo:
            raise ApiError(400, "echo with logprobs is not supported (it needs prompt logprobs)", param="echo")


def _echo_text(rt: ServerRuntime, prompt: str | list[int]) -> str:
    if isinstance(prompt, str):
        return prompt
    decoder = rt.adapter.text_decoder()
    return decoder.decode(torch.tensor(prompt)) + decoder.flush()


async def completions(rt: ServerRuntime, req: CompletionRequest, receive: Receive) -> Response:
    check_completion_request(rt, req)
    prompts = req.prompts()

    async def start(k: int) -> Choice:
        one = req.model_copy(update={"prompt": prompts[k // req.n]})
        sampling = request_sampling(one, max_tokens=("max_tokens", req.max_tokens))
        seed_for_choice(sampling, req.seed, k)
        c = await start_text_choice(rt, COMPLETIONS, "cmpl", one, sampling, k, req.logprobs, "logprobs")
        c.extra["echo"] = _echo_text(rt, one.prompt) if req.echo else ""
        c.extra["offset"] = len(c.extra["echo"])  # text_offset of the next logprob entry
        return c

    choices = await start_all(len(prompts) * req.n, start)
    head = {"id": choices[0].ex.request_id, "object": "text_completion", "created": int(time.time()), "model": rt.model_name}
    headers = {"x-request-id": choices[0].ex.request_id}
    if req.stream:
        body = ending_with_error(_stream(req, head, choices), choices[0].ex, lambda exc: (sse(exc.body()), SSE_DONE))
        return ManagedStreamingResponse(body, lambda: close_all(choices), media_type="text/event-stream", headers=headers)
    try:
        async with abort_on_disconnect(receive, lambda: close_all(choices)):
            texts = await asyncio.gather(*(run_whole(c) for c in choices))
    finally:
        close_all(choices)
    body = {
        **head,
        "choices": [
            {"index": c.index, "text": c.extra["echo"] + text,
             "logprobs": _legacy_logprobs(c, c.out.logprobs.content if c.out.logprobs else None),
             "finish_reason": finish_reason(c.ex.finish_reason)}
            for c, text in zip(choices, texts, strict=True)
        ],
        "usage": usage(choices, req.n),
    }
    return JSONResponse(body, headers=headers)


def _legacy_logprobs(c: Choice, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Chat-shaped logprob entries in the legacy completions shape."""
    if entries is None:
        return None
    offsets = []
    for e in entries:
        offsets.append(c.extra["offset"])
        c.extra["offset"] += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


async def _stream(req: CompletionRequest, head: dict[str, Any], choices: list[Choice]) -> AsyncIterator[bytes]:
    def frame(c: Choice, text: str, logprobs: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
        return sse({**head, "choices": [{"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": finish}]})

    async def frames(c: Choice) -> AsyncIterator[bytes]:
        if c.extra["echo"]:
            yield frame(c, c.extra["echo"])
        async for text, entries in text_deltas(c):
            yield frame(c, text, _legacy_logprobs(c, entries))
        if c.ex.finish_reason != "abort":
            yield frame(c, "", None, finish_reason(c.ex.finish_reason))

    async for item in interleave([frames(c) for c in choices]):
        yield item
    if any(c.ex.finish_reason == "abort" for c in choices):
        return  # the client is gone
    if req.stream_options is not None and req.stream_options.include_usage:
        yield sse({**head, "choices": [], "usage": usage(choices, req.n)})
    yield SSE_DONE
