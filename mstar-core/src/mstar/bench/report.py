"""The benchmark summary as a table for the terminal and as a JSON result file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mstar.bench.records import BenchRun

_METRICS = (
    ("ttft", "Time to first token", "ms"),
    ("tpot", "Time per output token (excl. 1st)", "ms"),
    ("itl", "Inter-token latency", "ms"),
    ("ttfa", "Time to first audio", "ms"),
    ("rtf", "Real-time factor (latency / audio)", ""),
    ("e2el", "End-to-end latency", "ms"),
)


def format_summary(summary: dict[str, Any], title: str = "Serving benchmark result") -> str:
    lines = [f"{f' {title} ':=^60}"]

    def row(label: str, value: Any) -> None:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<44}{text:>16}")

    row("Requests sent:", summary["requests"])
    row("Successful requests:", summary["completed"])
    row("Failed requests:", summary["failed"])
    row("Benchmark duration (s):", summary["duration"])
    row("Request throughput (req/s):", summary["request_throughput"])
    if "mean_ttft_ms" in summary or summary["total_output_tokens"]:  # speech reports no tokens
        row("Total input tokens:", summary["total_input_tokens"])
        row("Total generated tokens:", summary["total_output_tokens"])
        row("Output token throughput (tok/s):", summary["output_throughput"])
        row("Total token throughput (tok/s):", summary["total_token_throughput"])
    if "audio_throughput" in summary:
        row("Total audio generated (s):", summary["total_audio_seconds"])
        row("Audio throughput (audio s/s):", summary["audio_throughput"])
    stats = [k.removeprefix("mean_").removesuffix("_ms") for k in summary if k.startswith("mean_")]
    for key, label, unit in _METRICS:
        if key not in stats:
            continue
        suffix = f"_{key}_ms" if unit else f"_{key}"
        lines.append(f"{f' {label} ':-^60}")
        for name, value in summary.items():
            if name.endswith(suffix) and not math.isnan(value):
                stat = name.removesuffix(suffix)
                row(f"{stat.capitalize().replace('_', '.')} {key.upper()}{f' ({unit})' if unit else ''}:", value)
    lines.append("=" * 60)
    return "\n".join(lines)


def write_result(path: str | Path, summary: dict[str, Any], run: BenchRun, config: dict[str, Any], detailed: bool) -> None:
    """``summary`` plus the run's ``config`` as JSON (NaN written as null); with
    ``detailed``, every request's record too (``requests_detail``)."""
    doc: dict[str, Any] = {**summary, "config": config}
    if detailed:
        doc["requests_detail"] = [r.as_dict() for r in run.records]
    Path(path).write_text(json.dumps(_no_nan(doc), indent=2) + "\n")


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value
