"""The toy model's hook implementations (entry point ``toy`` in ``mstar.models``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import (
    EngineKind,
    FixedChunks,
    GraphSpec,
    LeftContextChunks,
    LinearWalks,
    Loop,
    NodeSpec,
    Signal,
    SlidingWindowChunks,
    Step,
    StreamingEdge,
    Walk,
)
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig

from mstar_toy.config import ARCHITECTURE, load_config

MODEL_NAME = "toy"


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
    from mstar_toy.lm import LOGPROB_SIGNALS

    lm_outputs = ("token", "codes", *LOGPROB_SIGNALS)
    lm_step = Step("lm", inputs=("token",), outputs=lm_outputs)
    return GraphSpec(
        nodes={"lm": NodeSpec("lm", EngineKind.KV_CACHE), "decoder": NodeSpec("decoder", EngineKind.STATELESS)},
        signals={
            "token": Signal("token", to_client=True, persist=True),
            # Emitted only for requests that asked for logprobs (mstar.api.adapter's convention).
            **{name: Signal(name, to_client=True) for name in LOGPROB_SIGNALS},
            "codes": Signal(
                "codes",
                stream=StreamingEdge("audio", "code_chunk", chunk_policy(config["stream"]), "code_context"),
            ),
            "audio": Signal("audio", to_client=True),
        },
        walks={
            "prefill": Walk("prefill", "lm", Step("lm", inputs=("prompt_ids",), outputs=lm_outputs)),
            "decode": Walk("decode", "lm", Loop("decode_loop", lm_step, stop_on=("lm",))),
            "vocode": Walk(
                "vocode",
                "audio",
                Loop(
                    "vocode_loop",
                    Step("decoder", inputs=("code_chunk", "code_context"), outputs=("audio",)),
                    until_stream_closed="codes",
                ),
            ),
        },
        state_machine=LinearWalks({"lm": ("prefill", "decode"), "audio": ("vocode",)}),
        request_inputs=("prompt_ids",),
    )


def _write_tiny(path: Path) -> None:
    from mstar_toy.checkpoint import write_checkpoint

    write_checkpoint(path)


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        name=MODEL_NAME,
        aliases=("toy-lm",),
        architectures=(ARCHITECTURE,),
        load_config=load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=_write_tiny,
        default_placement={"lm": "0", "decoder": "0"},
        max_model_len=lambda cfg: cfg["max_position_embeddings"],
        example_requests=_example_requests,
    )


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    from mstar_toy.config import encode_text

    ids = torch.tensor(encode_text("conformance", config["bos_token_id"]))
    return [{"inputs": {"prompt_ids": ids}, "sampling": {"main": {"temperature": 0, "max_tokens": 4, "ignore_eos": True}}}]


def _build_lm(config: dict[str, Any], checkpoint_dir: Path | None, device: str) -> Any:
    from mstar_toy.checkpoint import load_weights
    from mstar_toy.lm import ToyLM

    lm = ToyLM(config)
    if checkpoint_dir is not None:
        load_weights(lm, checkpoint_dir, "lm.")
    return lm.to(device)


def _build_decoder(config: dict[str, Any], checkpoint_dir: Path | None, device: str) -> Any:
    from mstar_toy.checkpoint import load_weights
    from mstar_toy.decoder import ToyDecoder

    dec = ToyDecoder(config)
    if checkpoint_dir is not None:
        load_weights(dec, checkpoint_dir, "decoder.")
    return dec.to(device)


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    return {"lm": _build_lm, "decoder": _build_decoder}


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
    return [MixedBatchConfig(node="lm", walks=("prefill", "decode"), merged_walk="mixed", max_rows={"prefill": 4})]


@hookimpl
def mstar_piecewise_graph_configs(model_name: str, node: str, submodule: Any) -> dict[str, PiecewiseGraphConfig]:
    if node != "lm":
        return {}
    return {"head": PiecewiseGraphConfig("head", submodule.sample_head, ("hidden",), uses_sampler=True)}


@hookimpl
def mstar_api_adapter(model_name: str, config: dict, checkpoint_dir: Path | None) -> Any:
    from mstar_toy.adapter import ToyApiAdapter

    return ToyApiAdapter(config)
