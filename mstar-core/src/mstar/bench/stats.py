"""Summary statistics of a benchmark run: throughput and latency percentiles.

Percentiles interpolate linearly between order statistics (numpy's default, as
``vllm bench serve`` reports them). Times are reported in milliseconds, as vLLM does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mstar.bench.records import BenchRun, RequestRecord

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: Sequence[float], percentiles: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """mean, median, std (population) and the given percentiles of ``values`` times ``scale``."""
    xs = [v * scale for v in values]
    if not xs:
        nan = math.nan
        return {"mean": nan, "median": nan, "std": nan, **{_pname(p): nan for p in percentiles}}
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return {"mean": mean, "median": percentile(xs, 50), "std": std, **{_pname(p): percentile(xs, p) for p in percentiles}}


def _pname(p: float) -> str:
    return f"p{p:g}".replace(".", "_")


def tpot(record: RequestRecord) -> float | None:
    """Time per output token after the first: (latency - TTFT) / (tokens - 1)."""
    if record.first_output is None or not record.output_tokens or record.output_tokens < 2:
        return None
    return (record.latency - record.first_output) / (record.output_tokens - 1)


def summarize(run: BenchRun, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    """Counts, throughput and per-metric statistics of ``run`` as a flat, JSON-ready dict.

    Keys follow ``vllm bench serve``: ``completed``, ``request_throughput``,
    ``output_throughput``, ``mean_ttft_ms``, ``p99_itl_ms`` and so on; speech adds
    ``audio_throughput`` (audio seconds per second), ``*_ttfa_ms`` and ``*_rtf``.
    """
    ok = [r for r in run.records if r.ok]
    chat = [r for r in ok if r.workload == "chat"]
    speech = [r for r in ok if r.workload == "speech"]
    duration = run.duration
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    audio = sum(r.audio_seconds for r in speech)
    summary: dict[str, Any] = {
        "duration": duration,
        "requests": run.requests_sent,
        "completed": len(ok),
        "failed": len(run.records) - len(ok),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration > 0 else math.nan,
        "output_throughput": out_tokens / duration if duration > 0 else math.nan,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else math.nan,
    }
    metrics: dict[str, tuple[list[float], float]] = {"e2el": ([r.latency for r in ok], 1000.0)}
    if chat:
        metrics["ttft"] = ([r.first_output for r in chat if r.first_output is not None], 1000.0)
        metrics["tpot"] = ([t for r in chat if (t := tpot(r)) is not None], 1000.0)
        metrics["itl"] = ([d for r in chat for d in r.inter_chunk], 1000.0)
    if speech:
        summary["total_audio_seconds"] = audio
        summary["audio_throughput"] = audio / duration if duration > 0 else math.nan
        metrics["ttfa"] = ([r.first_output for r in speech if r.first_output is not None], 1000.0)
        metrics["rtf"] = ([r.latency / r.audio_seconds for r in speech if r.audio_seconds > 0], 1.0)
    for name, (values, scale) in metrics.items():
        unit = "_ms" if scale == 1000.0 else ""
        for stat, value in describe(values, percentiles, scale).items():
            summary[f"{stat}_{name}{unit}"] = value
    return summary
