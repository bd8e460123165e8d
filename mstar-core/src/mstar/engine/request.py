"""A request inside the engine: its signals, walk cursors, streams and resources."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mstar.engine.kv_history import KVHistory
from mstar.engine.stream_buffer import StreamBuffer
from mstar.engine.walk_cursor import WalkCursor
from mstar.graph import Step
from mstar.model.submodule_base import (
    CurrentForwardPassInfo,
    NodeInputs,
    PerRequestState,
)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    """One event of a request: a signal value, or the final event (``finished``)."""

    request_id: str
    signal: str | None = None
    data: torch.Tensor | None = None
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    # "invalid_request" (bad input: the caller's fault), "too_large" (can never fit this
    # engine's KV pool) or "internal"; None without an error.
    error_type: str | None = None
    stream_item: bool = False  # an item of a stream consumed in another engine process
    stream_closed: bool = False  # that stream ended


@dataclass
class PreparedStep:
    """A step's full inputs, prepared once; ``done`` positions already ran (chunked prefill)."""

    inputs: NodeInputs
    info: CurrentForwardPassInfo
    stream_ends: dict[str, int] = field(default_factory=dict)  # stream signal -> consumed end
    # Prefix caching: the identity of each position of ``inputs`` (None: not shareable).
    cache_keys: Sequence[Hashable] | None = None
    # Stateless nodes with an output cache: the row's key (None: not cached).
    output_key: Hashable | None = None

    @property
    def total(self) -> int:
        return self.inputs.input_seq_len

    done: int = 0


@dataclass
class Request:
    id: str
    inputs: dict[str, torch.Tensor]
    kwargs: dict[str, Any]
    sampling: dict[str, Any]  # node -> MultiSamplingConfig (seeds resolved)
    arrival: int
    priority: int = 0
    status: RequestStatus = RequestStatus.WAITING
    signals: dict[str, torch.Tensor] = field(default_factory=dict)
    cursors: dict[str, WalkCursor] = field(default_factory=dict)
    streams: dict[str, StreamBuffer] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)  # sampling node -> sampler slot
    states: dict[str, PerRequestState] = field(default_factory=dict)
    prepared: dict[tuple[str, int], PreparedStep] = field(default_factory=dict)
    kv_history: dict[str, KVHistory] = field(default_factory=dict)  # KV node -> what it was fed
    needs_replay: set[str] = field(default_factory=set)
    num_generated: dict[str, int] = field(default_factory=dict)
    ready_since: dict[tuple[str, int], int] = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    aborted: bool = False

    def state(self, node: str) -> PerRequestState:
        if node not in self.states:
            self.states[node] = PerRequestState()
        return self.states[node]


def step_key(partition: str, step: Step) -> tuple[str, int]:
    return partition, id(step)
