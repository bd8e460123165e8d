"""The wire schema between the API process and engine processes (msgspec + msgpack).

Every message is a tagged ``msgspec.Struct``: decoding checks types, and nothing is
unpickled. Tensors travel as ``TensorMsg`` (inline bytes, or a shared-memory segment for
large ones; see ``mstar.server.tensor_codec``).
"""

from __future__ import annotations

from typing import Any

import msgspec


class TensorMsg(msgspec.Struct, array_like=True, omit_defaults=True):
    dtype: str
    shape: list[int]
    data: bytes = b""
    shm: str | None = None  # name of a shared-memory segment holding the bytes
    nbytes: int = 0


# ---- API process → engine process ------------------------------------------------------


class AddRequest(msgspec.Struct, tag="add", omit_defaults=True):
    request_id: str
    inputs: dict[str, TensorMsg]
    sampling: dict[str, Any]  # node -> {"main": {...}, "aux": {...}}, seeds resolved
    kwargs: dict[str, Any] = {}
    signals: list[str] | None = None  # client signals to send back (None: all)
    priority: int = 0


class AbortRequest(msgspec.Struct, tag="abort"):
    request_id: str


class PushStream(msgspec.Struct, tag="push_stream"):
    request_id: str
    signal: str
    value: TensorMsg


class CloseStream(msgspec.Struct, tag="close_stream"):
    request_id: str
    signal: str


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


Command = AddRequest | AbortRequest | PushStream | CloseStream | Shutdown


# ---- engine process → API process -----------------------------------------------------


class Event(msgspec.Struct, array_like=True, omit_defaults=True):
    """One ``RequestOutput``: a signal value, a cross-process stream item or close, or the
    request's end in this engine."""

    request_id: str
    signal: str | None = None
    value: TensorMsg | None = None
    stream_item: bool = False
    stream_closed: bool = False
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    # ``RequestOutput.error_type``: "invalid_request", "too_large" or "internal".
    error_type: str | None = None


class NodeKV(msgspec.Struct, array_like=True):
    node: str
    used_blocks: int
    total_blocks: int
    # Prefix caching (zeros without it): blocks in the prefix index, prompt positions looked
    # up and found there, and cached blocks evicted, since the engine started.
    cached_blocks: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_evictions: int = 0
    # Bytes a block costs (all layers, K and V); blocks held by cross-attention caches
    # (encoder–decoder nodes: KVCacheLayout.cross_attention), -1 for a node without them.
    block_bytes: int = 0
    cross_blocks: int = -1


class NodeOutputCache(msgspec.Struct, array_like=True):
    """A stateless node's output cache (``mstar.engine.output_cache``): entries and bytes
    held now; rows found (hits) and not found (misses), and entries evicted, since start."""

    node: str
    entries: int
    bytes: int
    hits: int
    misses: int
    evictions: int


class EngineStats(msgspec.Struct, array_like=True):
    waiting: int
    running: int
    batch_size: int
    kv: list[NodeKV]
    steps: int = 0  # since the engine started
    preemptions: int = 0
    requests: int = 0  # requests added since the engine started
    output_cache: list[NodeOutputCache] = []


class Events(msgspec.Struct, tag="events"):
    engine: str
    events: list[Event]


class Stats(msgspec.Struct, tag="stats"):
    engine: str
    stats: EngineStats


class Ready(msgspec.Struct, tag="ready"):
    engine: str
    pid: int
    nodes: list[str]
    stats: EngineStats


class Fatal(msgspec.Struct, tag="fatal"):
    engine: str
    error: str


Report = Events | Stats | Ready | Fatal

command_encoder = msgspec.msgpack.Encoder()
command_decoder = msgspec.msgpack.Decoder(Command)
report_encoder = msgspec.msgpack.Encoder()
report_decoder = msgspec.msgpack.Decoder(Report)
