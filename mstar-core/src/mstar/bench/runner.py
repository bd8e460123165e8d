"""Running a benchmark: warm-up, arrivals (all at once or a Poisson process), a
concurrency cap, a progress bar, and the records of every request."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx

from mstar.bench.client import send
from mstar.bench.records import BenchRequest, BenchRun, RequestRecord


@dataclass
class RunOptions:
    """How requests are sent. ``request_rate`` is requests per second (``inf``: all at
    once); arrivals are a Poisson process (``burstiness`` 1) or, more generally, gamma-
    distributed gaps with shape ``burstiness`` (below 1: burstier), as in ``vllm bench serve``."""

    base_url: str
    model: str | None = None
    api_key: str | None = None
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    warmups: int = 0
    stream: bool = True
    speech_format: str = "audio"
    timeout_s: float = 600.0
    progress: bool = False
    transport: httpx.AsyncBaseTransport | None = None  # e.g. httpx.ASGITransport(app) in-process


def arrival_gaps(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Seconds to wait before each of ``n`` requests: 0 for an infinite rate, else gamma
    gaps with mean ``1 / rate`` (exponential, i.e. Poisson arrivals, for burstiness 1)."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError("request rate and burstiness must be positive")
    rng = random.Random(seed)
    for _ in range(n):
        yield 0.0 if math.isinf(rate) else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


async def served_model(client: httpx.AsyncClient) -> str:
    """The first model ``GET /v1/models`` lists (used when no model is named)."""
    response = await client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def arun(requests: Sequence[BenchRequest], options: RunOptions) -> BenchRun:
    """Send ``requests`` as ``options`` say and return the measured run."""
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    width = options.max_concurrency or len(requests) or 1
    limits = httpx.Limits(max_connections=width + 4, max_keepalive_connections=width + 4)
    timeout = httpx.Timeout(options.timeout_s, connect=30.0)
    async with httpx.AsyncClient(
        base_url=options.base_url, headers=headers, timeout=timeout, limits=limits, transport=options.transport
    ) as client:
        model = options.model or await served_model(client)
        requests = [BenchRequest(r.workload, {"model": model, **r.body}) for r in requests]

        async def one(request: BenchRequest) -> RequestRecord:
            return await send(client, request, options.stream, options.speech_format)

        if options.warmups and requests:
            warm = [requests[i % len(requests)] for i in range(options.warmups)]
            await asyncio.gather(*(one(r) for r in warm))
        return await _measured(requests, options, one)


async def _measured(requests: Sequence[BenchRequest], options: RunOptions, one) -> BenchRun:
    sem = asyncio.Semaphore(options.max_concurrency) if options.max_concurrency else None
    bar = _progress(len(requests)) if options.progress else None

    async def limited(request: BenchRequest) -> RequestRecord:
        if sem is None:
            record = await one(request)
        else:
            async with sem:
                record = await one(request)
        if bar is not None:
            bar.update(1)
        return record

    tasks = []
    start = time.perf_counter()
    for request, gap in zip(requests, arrival_gaps(len(requests), options.request_rate, options.burstiness, options.seed), strict=True):
        if gap:
            await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(limited(request)))
    records = list(await asyncio.gather(*tasks))
    duration = time.perf_counter() - start
    if bar is not None:
        bar.close()
    return BenchRun(records, duration, len(requests))


def _progress(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="req", desc="benchmark")


def run(requests: Sequence[BenchRequest], options: RunOptions) -> BenchRun:
    """``arun`` from synchronous code (a script without an event loop)."""
    return asyncio.run(arun(requests, options))
