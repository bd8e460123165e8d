"""What one benchmark request measured, and what a run of many requests produced."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Workload = Literal["chat", "speech"]


@dataclass(frozen=True)
class BenchRequest:
    """One request to send: its workload and the JSON body (``model`` filled in by the runner)."""

    workload: Workload
    body: dict[str, Any]


@dataclass
class RequestRecord:
    """Timings of one request, in seconds from the moment it was sent.

    ``chunk_times`` are the arrival times of the response chunks that carried output (text
    or audio); the first is the time to first token (chat) or first audio (speech).
    """

    workload: Workload
    ok: bool = False
    error: str | None = None
    status: int | None = None
    latency: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    audio_seconds: float = 0.0

    @property
    def first_output(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def inter_chunk(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchRun:
    """Every measured request of a run (warm-up excluded) and the run's wall time."""

    records: list[RequestRecord]
    duration: float
    requests_sent: int
