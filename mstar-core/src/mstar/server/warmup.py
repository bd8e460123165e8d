"""The warm-up request: one small request through the whole path (preprocess pool, every
engine, cross-process streams) before the port opens, so the first client request pays no
first-use costs. It runs alone, then as two copies at once, so the nodes usually meet
several-row shapes too (``compile_regions`` compiles each new shape on its first call,
tens of seconds on a small CPU); the copies share a batch only if they arrive together. With
replicated groups each round runs on every replica index, concurrently, each run pinned to
replica i of every replicated group (i modulo that group's count)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mstar.api.adapter import CHAT, GENERATE, SPEECH, transcription_endpoint
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest, GenerateRequest
from mstar.api.sampling import request_sampling
from mstar.api.transcription import TranscriptionRequest
from mstar.server.execution import Execution
from mstar.server.runtime import ServerRuntime, StartupError

log = logging.getLogger("mstar.server")


async def warm_up(rt: ServerRuntime) -> None:
    """Run ``rt``'s adapter's warm-up request (chat, speech, transcription, or a native
    generate request: by default one of the endpoints the model serves); a failure stops the
    start-up with ``StartupError``."""
    request = rt.adapter.warmup_request()
    if request is None:
        log.info("the model's adapter names no warm-up request; skipping warm-up")
        return
    if isinstance(request, GenerateRequest):  # the native route: its own sampling form
        endpoint, sampling = GENERATE, request.sampling
    else:
        endpoint = _endpoint(request)
        if not rt.adapter.serves(endpoint):
            raise StartupError(f"the adapter's warm-up request is a {endpoint} request, an endpoint the model does not serve "
                               f"(it serves {sorted(rt.adapter.endpoints)}); return one of those from warmup_request()")
        sampling = request_sampling(request, max_tokens=("max_tokens", getattr(request, "max_tokens", None)))
    log.info("warming up with a %s request", endpoint)
    rounds = max(len(names) for names in rt.placement.group_engines().values())
    replicas = [i if rounds > 1 else None for i in range(rounds)]
    for copies in (1, 2):
        await asyncio.gather(*(_run(rt, endpoint, request, sampling, r) for r in replicas for _ in range(copies)))


def _endpoint(request: Any) -> str:
    if isinstance(request, ChatCompletionRequest):
        return CHAT
    if isinstance(request, TranscriptionRequest):
        return transcription_endpoint(request)
    return SPEECH


async def _run(rt: ServerRuntime, endpoint: str, request: Any, sampling: Any, replica: int | None) -> None:
    ex = Execution(rt, endpoint, prefix="warmup")
    if replica is not None:
        rt.router.pinned[ex.request_id] = replica
    await ex.start(request, sampling, getattr(request, "signals", None))
    try:
        async for _ in ex.batches():
            pass
    except ApiError as exc:
        raise StartupError(f"the warm-up request failed: {exc.message}") from None
    finally:
        ex.close()
