"""``POST /v1/completions``: OpenAI's text completions, whole or SSE.

Each prompt × ``n`` is one choice, run as its own request (index ``prompt * n + j``);
with a ``seed``, choice k samples with ``seed + k`` so choices differ yet repeat.
``echo`` prepends the prompt's text; ``logprobs: N`` returns the chosen token's logprob
and the top N alternatives per generated token (``text_offset`` counts the characters
of each token's text). Not supported, and answered with a 400: ``suffix``, ``best_of``
other than ``n``, and ``echo`` together with ``logprobs`` (that needs prompt logprobs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import torch
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from mstar.api.adapter import COMPLETIONS, not_served
from mstar.api.errors import ApiError
from mstar.api.protocol import CompletionRequest
from mstar.api.sampling import request_sampling
from mstar.sampling.params import MAX_TOP_LOGPROBS
from mstar.sampling.seeds import MAX_SEED
from mstar.server.execution import Execution
from mstar.server.logprobs import LogprobAssembler, logprob_signals
from mstar.server.output_tracker import OutputTracker
from mstar.server.runtime import ServerRuntime
from mstar.server.streaming import (
    SSE_DONE,
    ManagedStreamingResponse,
    abort_on_disconnect,
    ending_with_error,
    sse,
)
from mstar.server.text_output import finish_reason, stop_strings

MAX_CHOICES = 64


@dataclass
class _Choice:
    index: int
    ex: Execution
    out: OutputTracker
    echo: str
    offset: int = 0  # text_offset of the next logprob entry


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


async def _start(rt: ServerRuntime, req: CompletionRequest, index: int, prompt: str | list[int]) -> _Choice:
    adapter = rt.adapter
    one = req.model_copy(update={"prompt": prompt})
    sampling = request_sampling(one, max_tokens=("max_tokens", req.max_tokens))
    if req.seed is not None and index:
        sampling.set("seed", (req.seed + index) % (MAX_SEED + 1), "seed")
    signals = [adapter.text_signal] if adapter.text_signal else []
    logprobs = None
    if req.logprobs is not None:
        sampling.set("logprobs", True)
        sampling.set("top_logprobs", req.logprobs, "logprobs")
        signals += logprob_signals(adapter, req.logprobs)
        logprobs = LogprobAssembler(adapter, req.logprobs)
    ex = Execution(rt, COMPLETIONS, prefix="cmpl")
    await ex.start(one, sampling, signals)
    out = OutputTracker(rt, ex, adapter.text_decoder(), stop_strings(sampling.main.get("stop")), logprobs)
    echo = _echo_text(rt, prompt) if req.echo else ""
    return _Choice(index, ex, out, echo, len(echo))


async def completions(rt: ServerRuntime, req: CompletionRequest, receive: Receive) -> Response:
    check_completion_request(rt, req)
    prompts = req.prompts()
    choices: list[_Choice] = []

    def close_all() -> None:
        for c in choices:
            c.ex.close()

    try:
        for k in range(len(prompts) * req.n):
            choices.append(await _start(rt, req, k, prompts[k // req.n]))
    except BaseException:
        close_all()
        raise
    created = int(time.time())
    head = {"id": choices[0].ex.request_id, "object": "text_completion", "created": created, "model": rt.model_name}
    headers = {"x-request-id": choices[0].ex.request_id}
    if req.stream:
        body = ending_with_error(_stream(req, head, choices), choices[0].ex, lambda exc: (sse(exc.body()), SSE_DONE))
        return ManagedStreamingResponse(body, close_all, media_type="text/event-stream", headers=headers)
    try:
        async with abort_on_disconnect(receive, close_all):
            texts = await asyncio.gather(*(_run_whole(c) for c in choices))
    finally:
        close_all()
    body = {
        **head,
        "choices": [
            {"index": c.index, "text": c.echo + text, "logprobs": _legacy_logprobs(c, c.out.logprobs.content if c.out.logprobs else None),
             "finish_reason": finish_reason(c.ex.finish_reason)}
            for c, text in zip(choices, texts, strict=True)
        ],
        "usage": _usage(req, choices),
    }
    return JSONResponse(body, headers=headers)


async def _run_whole(c: _Choice) -> str:
    async for batch in c.ex.batches():
        c.out.consume(batch)
        if c.out.text.stopped:
            c.ex.stop()
            break
    c.out.finish()
    if c.out.logprobs is not None:
        c.out.logprobs.take()
    return c.out.text.text


def _usage(req: CompletionRequest, choices: list[_Choice]) -> dict[str, int]:
    # A prompt counts once, however many choices it has.
    prompt = sum(c.ex.engine_request.prompt_tokens for c in choices[:: req.n] if c.ex.engine_request)
    completion = sum(c.out.tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _legacy_logprobs(c: _Choice, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Chat-shaped logprob entries in the legacy completions shape."""
    if entries is None:
        return None
    offsets = []
    for e in entries:
        offsets.append(c.offset)
        c.offset += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


async def _stream(req: CompletionRequest, head: dict[str, Any], choices: list[_Choice]) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

    def frame(c: _Choice, text: str, logprobs: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
        return sse({**head, "choices": [{"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": finish}]})

    async def pump(c: _Choice) -> None:
        try:
            if c.echo:
                await queue.put(frame(c, c.echo))
            lp = c.out.logprobs
            async for batch in c.ex.batches():
                text, _ = c.out.consume(batch)
                entries = lp.take() if lp is not None else None
                if text or entries:
                    await queue.put(frame(c, text, _legacy_logprobs(c, entries)))
                if c.out.text.stopped:
                    c.ex.stop()
                    break
            last = c.out.finish()
            if last:
                await queue.put(frame(c, last))
            if c.ex.finish_reason != "abort":
                await queue.put(frame(c, "", None, finish_reason(c.ex.finish_reason)))
            await queue.put(None)
        except BaseException as exc:  # handed to the consumer, which ends the stream with it
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
    if any(c.ex.finish_reason == "abort" for c in choices):
        return  # the client is gone
    if req.stream_options is not None and req.stream_options.include_usage:
        yield sse({**head, "choices": [], "usage": _usage(req, choices)})
    yield SSE_DONE
