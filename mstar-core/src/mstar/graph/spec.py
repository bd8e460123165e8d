"""The static description of a model: nodes, walks over them, signals between them.

A walk body is a tree of ``Step`` (one forward of one node), ``Sequential``, ``Parallel``
(independent steps that may run in any order or batch) and ``Loop``. Walks belong to a
*partition*: the walks of one partition run one after another for a request, picked by the
model's ``WalkStateMachine``; different partitions run concurrently and talk through
streaming edges (e.g. an LM partition streaming tokens into a codec partition).

``GraphSpec.validate()`` runs when the plugin loads, so a malformed graph is a load-time
error naming what is wrong, never a failure in the middle of serving.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from mstar.graph.chunking import ChunkPolicy


class GraphError(ValueError):
    """A model graph is malformed; the message names the offending part."""


class EngineKind(enum.Enum):
    KV_CACHE = "kv_cache"  # autoregressive, owns paged KV streams per request
    STATELESS = "stateless"  # encoders, projections, codecs


@dataclass(frozen=True)
class NodeSpec:
    name: str
    kind: EngineKind


@dataclass(frozen=True)
class StreamingEdge:
    """Feeds a signal, as it grows, into another partition in chunks.

    The consumer reads the chunk under ``chunk_signal``; ``context_signal`` (optional) carries
    how many leading items of the chunk are context only. With ``past_end_signal`` set, a
    consumer keeps stepping after the stream closed and drained: each further step gets an
    empty chunk (no items) and, under ``past_end_signal``, how many such chunks it got
    before (0, 1, ...); the signal is absent from chunks that hold items. Its loop then
    needs another stop (``stop_on``, ``max_iters``).
    """

    into_partition: str
    chunk_signal: str
    policy: ChunkPolicy
    context_signal: str | None = None
    past_end_signal: str | None = None


@dataclass(frozen=True)
class Signal:
    """A named tensor produced by steps.

    ``to_client``: every produced value is sent to the client as an output event.
    ``persist``: kept across walks of the request (otherwise cleared when a walk ends).
    ``stream``: appended (along dim 0) to a stream feeding another partition.
    """

    name: str
    to_client: bool = False
    persist: bool = False
    stream: StreamingEdge | None = None


@dataclass(frozen=True)
class Step:
    node: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sequential:
    parts: tuple[WalkPart, ...]


@dataclass(frozen=True)
class Parallel:
    """Independent steps; the walk continues once all of them ran."""

    parts: tuple[Step, ...]


@dataclass(frozen=True)
class Loop:
    """Repeats ``body`` until a stop.

    Stops come from ``stop_on`` nodes (their ``check_stop`` names this loop), from
    ``max_iters``, or — for a loop consuming a stream — when ``until_stream_closed`` is
    closed and drained. A loop with none of these is rejected. ``STOP_ALL`` from any step
    (core's stop rules use it) ends the whole partition, loops included.
    """

    name: str
    body: WalkPart
    stop_on: tuple[str, ...] = ()
    max_iters: int | None = None
    until_stream_closed: str | None = None


WalkPart = Step | Sequential | Parallel | Loop


@dataclass(frozen=True)
class Walk:
    name: str
    partition: str
    body: WalkPart


class WalkStateMachine(Protocol):
    """The model's per-request choice of walks, one partition at a time."""

    def first_walk(self, partition: str, request_kwargs: Mapping) -> str | None: ...

    def next_walk(self, partition: str, finished_walk: str, request_kwargs: Mapping) -> str | None: ...


@dataclass(frozen=True)
class LinearWalks:
    """The common state machine: each partition runs a fixed list of walks in order."""

    order: Mapping[str, tuple[str, ...]]

    def first_walk(self, partition: str, request_kwargs: Mapping) -> str | None:
        walks = self.order.get(partition, ())
        return walks[0] if walks else None

    def next_walk(self, partition: str, finished_walk: str, request_kwargs: Mapping) -> str | None:
        walks = self.order[partition]
        i = walks.index(finished_walk)
        return walks[i + 1] if i + 1 < len(walks) else None

    def walks(self) -> set[str]:
        return {w for ws in self.order.values() for w in ws}


def iter_steps(part: WalkPart) -> Iterator[Step]:
    if isinstance(part, Step):
        yield part
    elif isinstance(part, Sequential | Parallel):
        for p in part.parts:
            yield from iter_steps(p)
    elif isinstance(part, Loop):
        yield from iter_steps(part.body)
    else:
        raise GraphError(f"unknown walk part {part!r}")


def iter_loops(part: WalkPart) -> Iterator[Loop]:
    if isinstance(part, Loop):
        yield part
        yield from iter_loops(part.body)
    elif isinstance(part, Sequential):
        for p in part.parts:
            yield from iter_loops(p)


@dataclass
class GraphSpec:
    nodes: dict[str, NodeSpec]
    walks: dict[str, Walk]
    signals: dict[str, Signal]
    state_machine: WalkStateMachine
    request_inputs: tuple[str, ...] = ()
    partitions: tuple[str, ...] = field(default=())
    # Inputs a request may leave out: name -> the value it then gets (anything torch.as_tensor
    # takes), e.g. an encoder-decoder model's decoder prompt, from the checkpoint's config.
    input_defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.partitions:
            self.partitions = tuple(dict.fromkeys(w.partition for w in self.walks.values()))

    def stream_edges(self) -> dict[str, Signal]:
        return {name: s for name, s in self.signals.items() if s.stream is not None}

    def missing_inputs(self, inputs: Mapping[str, object]) -> list[str]:
        """The request inputs this graph needs that ``inputs`` lacks (the one rule for the
        native API route and for ``mstar.Engine``)."""
        return sorted(set(self.request_inputs) - set(inputs))

    def validate(self) -> None:
        """Raise GraphError naming the first malformed part."""
        for key, node in self.nodes.items():
            if key != node.name:
                raise GraphError(f"node registered as {key!r} is named {node.name!r}")
        for key, sig in self.signals.items():
            if key != sig.name:
                raise GraphError(f"signal registered as {key!r} is named {sig.name!r}")
        clash = sorted(set(self.input_defaults) & set(self.request_inputs))
        if clash:
            raise GraphError(f"input(s) {clash} are both required (request_inputs) and defaulted (input_defaults)")
        produced: set[str] = set(self.request_inputs) | set(self.input_defaults)
        for sig in self.signals.values():
            if sig.stream is not None:
                edge = sig.stream
                if edge.into_partition not in self.partitions:
                    raise GraphError(
                        f"streaming edge of signal {sig.name!r} goes into unknown partition "
                        f"{edge.into_partition!r} (partitions: {sorted(self.partitions)})"
                    )
                produced.add(edge.chunk_signal)
                for extra in (edge.context_signal, edge.past_end_signal):
                    if extra:
                        produced.add(extra)
        for walk in self.walks.values():
            for step in iter_steps(walk.body):
                produced.update(step.outputs)
        for key, walk in self.walks.items():
            if key != walk.name:
                raise GraphError(f"walk registered as {key!r} is named {walk.name!r}")
            if walk.partition not in self.partitions:
                raise GraphError(f"walk {walk.name!r} is in unknown partition {walk.partition!r}")
            for step in iter_steps(walk.body):
                if step.node not in self.nodes:
                    raise GraphError(
                        f"walk {walk.name!r} steps through unknown node {step.node!r} "
                        f"(nodes: {sorted(self.nodes)})"
                    )
                for name in (*step.inputs, *step.outputs):
                    if (name not in self.signals and name not in self.request_inputs and name not in self.input_defaults
                            and not self._is_chunk_signal(name)):
                        raise GraphError(f"walk {walk.name!r}, node {step.node!r}: unknown signal {name!r}")
                for name in step.inputs:
                    if name not in produced:
                        raise GraphError(
                            f"walk {walk.name!r}, node {step.node!r}: input signal {name!r} has no producer"
                        )
            for loop in iter_loops(walk.body):
                if not loop.stop_on and loop.max_iters is None and loop.until_stream_closed is None:
                    raise GraphError(f"loop {loop.name!r} in walk {walk.name!r} has no stop (stop_on, max_iters or until_stream_closed)")
                for n in loop.stop_on:
                    if n not in self.nodes:
                        raise GraphError(f"loop {loop.name!r} stops on unknown node {n!r}")
                if loop.until_stream_closed is not None:
                    sig = self.signals.get(loop.until_stream_closed)
                    if sig is None or sig.stream is None:
                        raise GraphError(f"loop {loop.name!r} waits on {loop.until_stream_closed!r}, which is not a streaming signal")
            if isinstance(walk.body, Parallel):
                for p in walk.body.parts:
                    if not isinstance(p, Step):
                        raise GraphError(f"Parallel in walk {walk.name!r} may only hold Steps")
        known_walks = getattr(self.state_machine, "walks", None)
        if callable(known_walks):
            for name in known_walks():
                if name not in self.walks:
                    raise GraphError(f"the state machine names unknown walk {name!r} (walks: {sorted(self.walks)})")

    def _is_chunk_signal(self, name: str) -> bool:
        return any(
            s.stream is not None and name in (s.stream.chunk_signal, s.stream.context_signal, s.stream.past_end_signal)
            for s in self.signals.values()
        )
