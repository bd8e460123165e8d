"""Several choices of one HTTP request (``n`` > 1, or a list of prompts): each choice is its
own engine request; whole responses gather them, streams interleave their frames as they
come. With a ``seed``, choice k samples with ``seed + k``, so choices differ yet repeat."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mstar.api.sampling import RequestSampling
from mstar.sampling.seeds import MAX_SEED
from mstar.server.execution import Execution
from mstar.server.logprobs import LogprobAssembler, logprob_signals
from mstar.server.output_tracker import OutputTracker
from mstar.server.runtime import ServerRuntime
from mstar.server.text_output import stop_strings


@dataclass
class Choice:
    index: int
    ex: Execution
    out: OutputTracker
    extra: dict[str, Any] = field(default_factory=dict)  # the route's own per-choice state


def seed_for_choice(sampling: RequestSampling, seed: int | None, index: int) -> None:
    if seed is not None and index:
        sampling.set("seed", (seed + index) % (MAX_SEED + 1), "seed")


async def start_text_choice(
    rt: ServerRuntime, endpoint: str, prefix: str, request: Any, sampling: RequestSampling, index: int,
    top_logprobs: int | None, top_param: str = "top_logprobs",
) -> Choice:
    """Start one text choice; ``top_logprobs`` None means no logprobs (``top_param``: the
    request field it came from, for errors)."""
    adapter = rt.adapter
    signals = [adapter.text_signal] if adapter.text_signal else []
    logprobs = None
    if top_logprobs is not None:
        sampling.set("logprobs", True)
        sampling.set("top_logprobs", top_logprobs, top_param)
        signals += logprob_signals(adapter, top_logprobs)
        logprobs = LogprobAssembler(adapter, top_logprobs)
    ex = Execution(rt, endpoint, prefix=prefix)
    await ex.start(request, sampling, signals)
    out = OutputTracker(rt, ex, adapter.text_decoder(), stop_strings(sampling.main.get("stop")), logprobs)
    return Choice(index, ex, out)


async def start_all(count: int, start: Callable[[int], Awaitable[Choice]]) -> list[Choice]:
    """``start(k)`` for every choice; if one fails, the started ones are closed."""
    choices: list[Choice] = []
    try:
        for k in range(count):
            choices.append(await start(k))
    except BaseException:
        close_all(choices)
        raise
    return choices


def close_all(choices: list[Choice]) -> None:
    for c in choices:
        c.ex.close()


async def run_whole(c: Choice) -> str:
    """Run a choice to its end; returns its text (logprob entries stay in ``out.logprobs``)."""
    async for batch in c.ex.batches():
        c.out.consume(batch)
        if c.out.text.stopped:
            c.ex.stop()
            break
    c.out.finish()
    if c.out.logprobs is not None:
        c.out.logprobs.take()
    return c.out.text.text


async def text_deltas(c: Choice) -> AsyncIterator[tuple[str, list[dict[str, Any]] | None]]:
    """(text delta, new logprob entries) as a choice's outputs arrive, ending with the
    detokenizer's flush; stops the request when a stop string matched."""
    lp = c.out.logprobs
    async for batch in c.ex.batches():
        text, _ = c.out.consume(batch)
        entries = lp.take() if lp is not None else None
        if text or entries:
            yield text, entries
        if c.out.text.stopped:
            c.ex.stop()
            break
    last = c.out.finish()
    if last:
        yield last, None


async def interleave(streams: list[AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
    """The frames of every stream as they come; the first error ends the whole."""
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[bytes]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
            await queue.put(None)
        except BaseException as exc:  # handed to the consumer, which ends the stream with it
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
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


def usage(choices: list[Choice], per_prompt: int) -> dict[str, int]:
    """A prompt counts once, however many choices it has (``per_prompt`` = n)."""
    prompt = sum(c.ex.engine_request.prompt_tokens for c in choices[::per_prompt] if c.ex.engine_request)
    completion = sum(c.out.tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
