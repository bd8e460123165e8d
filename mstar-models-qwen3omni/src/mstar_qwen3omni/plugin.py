"""Qwen3-Omni's hook implementations (entry point ``qwen3omni`` in ``mstar.models``).

Graph: partition ``thinker`` runs ``prefill`` then the ``decode`` loop on the KV node
``thinker``; each step samples one text token. Prefill and decode rows of different
requests share one forward (a mixed batch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import EngineKind, GraphSpec, LinearWalks, Loop, NodeSpec, Signal, Step, Walk
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig

from mstar_qwen3omni.config import ARCHITECTURE, load_config

MODEL_NAME = "qwen3omni"
THINKER = "thinker"
THINKER_OUTPUTS = ("token", "logits")
# Released default: <|im_end|>, <|endoftext|> (generation_config.json overrides).
DEFAULT_EOS = (151645, 151643)


def build_graph(config: dict[str, Any]) -> GraphSpec:
    return GraphSpec(
        nodes={THINKER: NodeSpec(THINKER, EngineKind.KV_CACHE)},
        signals={
            "token": Signal("token", to_client=True, persist=True),
            "logits": Signal("logits", to_client=True),  # only for requests asking for it
        },
        walks={
            "prefill": Walk("prefill", THINKER, Step(THINKER, inputs=("prompt_ids",), outputs=THINKER_OUTPUTS)),
            "decode": Walk(
                "decode", THINKER, Loop("decode_loop", Step(THINKER, ("token",), THINKER_OUTPUTS), stop_on=(THINKER,))
            ),
        },
        state_machine=LinearWalks({THINKER: ("prefill", "decode")}),
        request_inputs=("prompt_ids",),
    )


def eos_token_ids(config: dict[str, Any]) -> tuple[int, ...]:
    ids = config.get("_generation", {}).get("eos_token_id", DEFAULT_EOS)
    return tuple(int(i) for i in (ids if isinstance(ids, list | tuple) else [ids]))


def _load_config(checkpoint_dir: Path) -> dict[str, Any]:
    config = load_config(checkpoint_dir)
    gen = Path(checkpoint_dir) / "generation_config.json"
    if gen.is_file():
        config = {**config, "_generation": json.loads(gen.read_text())}
    return config


def _write_tiny(path: Path) -> None:
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint

    write_checkpoint(path)


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    # <|im_start|>user\n ... <|im_end|>\n<|im_start|>assistant\n (released ids)
    ids = torch.tensor([151644, 872, 198, 100, 101, 102, 151645, 198, 151644, 77091, 198])
    return [{"inputs": {"prompt_ids": ids}, "sampling": {"main": {"temperature": 0, "max_tokens": 4}}}]


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        name=MODEL_NAME,
        aliases=("qwen3-omni",),
        architectures=(ARCHITECTURE,),
        load_config=_load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=_write_tiny,
        default_placement={THINKER: "0"},
        max_model_len=lambda cfg: int(cfg["thinker_config"]["text_config"].get("max_position_embeddings", 32768)),
        example_requests=_example_requests,
    )


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    from mstar_qwen3omni.loading import build_thinker

    return {THINKER: build_thinker}


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    from mstar.sampling import SamplingParams

    gen = config.get("_generation", {})
    defaults = {k: gen[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty") if k in gen}
    return {
        THINKER: NodeSamplers(
            vocab_size=int(config["thinker_config"]["text_config"]["vocab_size"]),
            main=SamplingParams(**{"max_tokens": 1024, **defaults}),
            stop_token_ids=eos_token_ids(config),
            prompt_signal="prompt_ids",
        )
    }


@hookimpl
def mstar_mixed_batch_configs(model_name: str, config: dict) -> list[MixedBatchConfig]:
    return [MixedBatchConfig(node=THINKER, walks=("prefill", "decode"), merged_walk="mixed", max_rows={"prefill": 8})]


@hookimpl
def mstar_piecewise_graph_configs(model_name: str, node: str, submodule: Any) -> dict[str, PiecewiseGraphConfig]:
    if node != THINKER:
        return {}
    return {"head": PiecewiseGraphConfig("head", submodule.sample_head, ("hidden",), uses_sampler=True)}
