"""A streaming edge with ``past_end_signal``: the consumer keeps stepping after the stream
closed, getting empty chunks numbered 0, 1, ... under that signal, until its own stop.

A tiny two-partition graph of stateless nodes: ``producer`` emits one item per step for three
steps; ``consumer`` loops (max_iters) over the stream one item at a time and echoes what it
got. Without the signal the same consumer loop ends when the stream is drained."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from mstar.engine.core import EngineCore
from mstar.engine.executors import LoadedNode
from mstar.engine.request import Request
from mstar.graph import (
    EngineKind,
    FixedChunks,
    GraphSpec,
    LinearWalks,
    Loop,
    NodeSpec,
    Signal,
    Step,
    StreamingEdge,
    Walk,
)
from mstar.model.submodule_base import BatchedModelOutput, NodeInputs, NodeSubmodule

ITEMS, CONSUMER_STEPS = 3, 6


class Producer(NodeSubmodule):
    def prepare_inputs(self, graph_walk, info, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        return NodeInputs(kwargs={"i": info.iteration})

    def forward_batched(self, graph_walk, engine_inputs, inputs) -> BatchedModelOutput:
        return BatchedModelOutput(per_rid_outputs={
            rid: {"items": torch.tensor([[10.0 + inp.kwargs["i"]]])} for rid, inp in zip(engine_inputs.request_ids, inputs, strict=True)
        })


class Consumer(NodeSubmodule):
    def prepare_inputs(self, graph_walk, info, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        chunk = signals["chunk"].reshape(-1)
        past = signals.get("past_end")
        # what this step saw: the item, or -(k+1) for the k-th empty chunk past the end
        seen = float(chunk[0]) if chunk.numel() else -1.0 - float(past)
        assert chunk.numel() or past is not None
        return NodeInputs(kwargs={"seen": seen})

    def forward_batched(self, graph_walk, engine_inputs, inputs) -> BatchedModelOutput:
        return BatchedModelOutput(per_rid_outputs={
            rid: {"echo": torch.tensor([inp.kwargs["seen"]])} for rid, inp in zip(engine_inputs.request_ids, inputs, strict=True)
        })


def graph(past_end: bool) -> GraphSpec:
    edge = StreamingEdge("sink", "chunk", FixedChunks(1), past_end_signal="past_end" if past_end else None)
    until = None if past_end else "items"
    return GraphSpec(
        nodes={"producer": NodeSpec("producer", EngineKind.STATELESS), "consumer": NodeSpec("consumer", EngineKind.STATELESS)},
        walks={
            "produce": Walk("produce", "source", Loop("p", Step("producer", ("prompt",), ("items",)), max_iters=ITEMS)),
            "consume": Walk("consume", "sink", Loop(
                "c", Step("consumer", ("chunk",), ("echo",)), max_iters=CONSUMER_STEPS, until_stream_closed=until
            )),
        },
        signals={"items": Signal("items", stream=edge), "echo": Signal("echo", to_client=True)},
        state_machine=LinearWalks({"source": ("produce",), "sink": ("consume",)}),
        request_inputs=("prompt",),
    )


def run(past_end: bool) -> list[float]:
    g = graph(past_end)
    g.validate()
    cpu = torch.device("cpu")
    nodes = {
        "producer": LoadedNode("producer", EngineKind.STATELESS, Producer(), cpu),
        "consumer": LoadedNode("consumer", EngineKind.STATELESS, Consumer(), cpu),
    }
    core = EngineCore(g, nodes)
    core.add_request(Request("r", {"prompt": torch.zeros(1)}, {}, {}, 0))
    echoed: list[float] = []
    for _ in range(50):
        for out in core.step():
            if out.signal == "echo":
                echoed.append(float(out.data))
            if out.finished:
                assert out.error is None, out.error
                return echoed
    raise AssertionError("the request never finished")


def test_consumer_steps_past_the_end_with_numbered_empty_chunks():
    assert run(past_end=True) == [10.0, 11.0, 12.0, -1.0, -2.0, -3.0]


def test_without_the_signal_the_loop_ends_when_the_stream_drains():
    assert run(past_end=False) == [10.0, 11.0, 12.0]
