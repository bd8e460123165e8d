"""Malformed graphs are rejected when the plugin loads, naming what is wrong."""

from __future__ import annotations

import pytest
from mstar.graph import (
    EngineKind,
    FixedChunks,
    GraphError,
    GraphSpec,
    LinearWalks,
    Loop,
    NodeSpec,
    Signal,
    Step,
    StreamingEdge,
    Walk,
)


def graph(**changes) -> GraphSpec:
    parts = {
        "nodes": {"lm": NodeSpec("lm", EngineKind.KV_CACHE), "dec": NodeSpec("dec", EngineKind.STATELESS)},
        "signals": {
            "tok": Signal("tok", to_client=True, persist=True, stream=StreamingEdge("audio", "chunk", FixedChunks(4))),
            "wav": Signal("wav", to_client=True),
        },
        "walks": {
            "prefill": Walk("prefill", "lm", Step("lm", ("prompt",), ("tok",))),
            "decode": Walk("decode", "lm", Loop("d", Step("lm", ("tok",), ("tok",)), stop_on=("lm",))),
            "voc": Walk("voc", "audio", Loop("v", Step("dec", ("chunk",), ("wav",)), until_stream_closed="tok")),
        },
        "state_machine": LinearWalks({"lm": ("prefill", "decode"), "audio": ("voc",)}),
        "request_inputs": ("prompt",),
    }
    parts.update(changes)
    return GraphSpec(**parts)


def test_well_formed_graph_validates():
    graph().validate()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"walks": {"prefill": Walk("prefill", "lm", Step("llm", ("prompt",), ("tok",)))}}, "unknown node 'llm'"),
        ({"walks": {"prefill": Walk("prefill", "lm", Step("lm", ("prompt",), ("tokens",)))}}, "unknown signal 'tokens'"),
        ({"walks": {"decode": Walk("decode", "lm", Loop("d", Step("lm", ("tok",), ("tok",))))}}, "loop 'd' in walk 'decode' has no stop"),
        ({"request_inputs": (), "signals": {**graph().signals, "prompt": Signal("prompt")}}, "input signal 'prompt' has no producer"),
        ({"state_machine": LinearWalks({"lm": ("prefill", "decoding")})}, "unknown walk 'decoding'"),
        ({"signals": {"tok": Signal("tok", stream=StreamingEdge("nowhere", "chunk", FixedChunks(4))), "wav": Signal("wav")}}, "unknown partition 'nowhere'"),
        ({"walks": {"voc": Walk("voc", "audio", Loop("v", Step("dec", ("chunk",), ("wav",)), until_stream_closed="wav"))}}, "not a streaming signal"),
    ],
)
def test_malformed_graph_names_the_problem(change, message):
    base = graph()
    if "walks" in change:
        change = {"walks": {**base.walks, **change["walks"]}}
    with pytest.raises(GraphError, match=message):
        graph(**change).validate()


def test_bad_chunk_policy_is_rejected():
    with pytest.raises(ValueError, match="size must be >= 1"):
        FixedChunks(0)
