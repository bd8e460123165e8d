"""The toy model's hook implementations (entry point ``toy`` in ``mstar.models``).

Its name, alias and architecture live in the entry points (pyproject.toml); this module
declares how to build it. Everything heavy is imported lazily, so listing and loading the
plugin imports no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import FixedChunks, GraphSpec, LeftContextChunks, Signal, SlidingWindowChunks
from mstar.graph.shapes import prefill_decode_mixing, streaming_lm_graph
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig, lazy

from mstar_toy.config import load_config

# The toy LM's logprob signals (mstar.api.adapter's convention), emitted when a row asks.
LOGPROB_SIGNALS = ("logprob", "top_logprob_ids", "top_logprob_values")


def chunk_policy(stream: dict[str, Any]) -> Any:
    kind = stream["policy"]
    if kind == "fixed":
        return FixedChunks(stream["chunk"])
    if kind == "sliding_window":
        return SlidingWindowChunks(stream["window"], stream["hop"])
    if kind == "left_context":
        return LeftContextChunks(stream["chunk"], stream.get("left_context", 0), stream.get("first_chunk"))
    raise ValueError(f"unknown stream policy {kind!r}")


def build_graph(config: dict[str, Any]) -> GraphSpec:
    """``lm`` samples a byte token and a residual code per step; the (token, code) pairs
    stream into ``decoder``, which turns each chunk into audio."""
    return streaming_lm_graph(
        lm="lm",
        decoder="decoder",
        request_inputs=("prompt_ids",),
        step_inputs=("token",),
        lm_outputs=("token", "codes", *LOGPROB_SIGNALS),
        stream="codes",
        chunk_policy=chunk_policy(config["stream"]),
        chunk_inputs=("code_chunk", "code_context"),
        signals={
            "token": Signal("token", to_client=True, persist=True),
            **{name: Signal(name, to_client=True) for name in LOGPROB_SIGNALS},
        },
    )


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    from mstar_toy.config import encode_text

    ids = torch.tensor(encode_text("conformance", config["bos_token_id"]))
    return [{"inputs": {"prompt_ids": ids}, "sampling": {"main": {"temperature": 0, "max_tokens": 4, "ignore_eos": True}}}]


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        load_config=load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=lazy("mstar_toy.checkpoint:write_checkpoint"),
        default_placement={"lm": "0", "decoder": "0"},
        example_requests=_example_requests,
        float32_nodes=("decoder",),  # audio out: no half precision
    )


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    return {"lm": lazy("mstar_toy.checkpoint:build_lm"), "decoder": lazy("mstar_toy.checkpoint:build_decoder")}


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    from mstar.sampling import SamplingParams

    from mstar_toy.lm import AUX_LABEL

    return {
        "lm": NodeSamplers(
            vocab_size=config["vocab_size"],
            main=SamplingParams(temperature=0.8, top_p=0.95, max_tokens=64),
            aux={AUX_LABEL: SamplingParams(temperature=1.0, top_k=8)},
            aux_vocab_sizes={AUX_LABEL: config["residual_codes"]},
            stop_token_ids=(config["eos_token_id"],),
            prompt_signal="prompt_ids",
        )
    }


@hookimpl
def mstar_mixed_batch_configs(model_name: str, config: dict) -> list[MixedBatchConfig]:
    return prefill_decode_mixing("lm")


@hookimpl
def mstar_piecewise_graph_configs(model_name: str, node: str, submodule: Any) -> dict[str, PiecewiseGraphConfig]:
    if node != "lm":
        return {}
    return {"head": PiecewiseGraphConfig("head", submodule.sample_head, ("hidden",), uses_sampler=True)}


@hookimpl
def mstar_api_adapter(model_name: str, config: dict, checkpoint_dir: Path | None) -> Any:
    from mstar_toy.adapter import ToyApiAdapter

    return ToyApiAdapter(config)
