"""Qwen3-Omni's hook implementations (entry point ``qwen3omni`` in ``mstar.models``).

Graph: partition ``thinker`` runs ``prefill`` then the ``decode`` loop on the KV node
``thinker`` (``mstar.text.lm``'s text-LLM graph and signals); each step samples one text
token. Prefill and decode rows of different requests share one forward (a mixed batch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import GraphSpec
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers

from mstar_qwen3omni.config import ARCHITECTURE, load_config

MODEL_NAME = "qwen3omni"
THINKER = "thinker"
GENERATION_CONFIG = "generation_config"


def build_graph(config: dict[str, Any]) -> GraphSpec:
    from mstar.text.lm import text_lm_graph

    return text_lm_graph(THINKER)


def text_view(config: dict[str, Any]) -> dict[str, Any]:
    """The Thinker's text config with the checkpoint's generation config: the flat keys
    ``mstar.text`` reads (vocab_size, max_position_embeddings, EOS ids)."""
    return {**config["thinker_config"]["text_config"], GENERATION_CONFIG: config.get(GENERATION_CONFIG) or {}}


def _load_config(checkpoint_dir: Path) -> dict[str, Any]:
    config = load_config(checkpoint_dir)
    gen = Path(checkpoint_dir) / "generation_config.json"
    return {**config, GENERATION_CONFIG: json.loads(gen.read_text())} if gen.is_file() else config


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
        max_model_len=lambda cfg: int(text_view(cfg).get("max_position_embeddings", 32768)),
        example_requests=_example_requests,
    )


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    from mstar_qwen3omni.loading import build_thinker

    return {THINKER: build_thinker}


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    from mstar.text.lm import text_lm_samplers

    gen = config.get(GENERATION_CONFIG) or {}
    defaults = {k: gen[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty") if k in gen}
    return text_lm_samplers(text_view(config), THINKER, **{"max_tokens": 1024, **defaults})


@hookimpl
def mstar_mixed_batch_configs(model_name: str, config: dict) -> list[MixedBatchConfig]:
    from mstar.text.lm import text_lm_mixed_batches

    return text_lm_mixed_batches(THINKER)


@hookimpl
def mstar_api_adapter(model_name: str, config: dict, checkpoint_dir: Path | None) -> Any:
    from mstar.api.text_adapter import TextLMAdapter

    if checkpoint_dir is None:
        raise ValueError("the Qwen3-Omni API adapter needs the checkpoint directory (tokenizer, chat template)")
    return TextLMAdapter(checkpoint_dir, text_view(config), node=THINKER)
