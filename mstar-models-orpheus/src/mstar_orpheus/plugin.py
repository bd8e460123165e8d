"""Orpheus's hook implementations (entry point ``orpheus`` in ``mstar.models``).

Graph: partition ``lm`` runs ``prefill`` then the ``decode`` loop; each step samples a
token and, for an accepted audio token, appends its SNAC code to the ``code`` stream.
Partition ``audio`` runs ``vocode``: every 7 codes from the 28th on, node ``snac`` decodes
the last 28 and emits 2048 samples at 24 kHz, while the LM keeps decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import (
    EngineKind,
    GraphSpec,
    LinearWalks,
    Loop,
    NodeSpec,
    Signal,
    Step,
    StreamingEdge,
    Walk,
)
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig

from mstar_orpheus.audio_codes import OrpheusWindows
from mstar_orpheus.config import ARCHITECTURE, SNAC_DIR, load_config

MODEL_NAME = "orpheus"
LM_OUTPUTS = ("token", "code", "logits")


def build_graph(config: dict[str, Any]) -> GraphSpec:
    return GraphSpec(
        nodes={"lm": NodeSpec("lm", EngineKind.KV_CACHE), "snac": NodeSpec("snac", EngineKind.STATELESS)},
        signals={
            "token": Signal("token", to_client=True, persist=True),
            "code": Signal("code", stream=StreamingEdge("audio", "code_window", OrpheusWindows())),
            "logits": Signal("logits", to_client=True),  # only for requests asking for it
            "audio": Signal("audio", to_client=True),
        },
        walks={
            "prefill": Walk("prefill", "lm", Step("lm", inputs=("prompt_ids",), outputs=LM_OUTPUTS)),
            "decode": Walk("decode", "lm", Loop("decode_loop", Step("lm", ("token",), LM_OUTPUTS), stop_on=("lm",))),
            "vocode": Walk(
                "vocode",
                "audio",
                Loop("vocode_loop", Step("snac", ("code_window",), ("audio",)), until_stream_closed="code"),
            ),
        },
        state_machine=LinearWalks({"lm": ("prefill", "decode"), "audio": ("vocode",)}),
        request_inputs=("prompt_ids",),
    )


def _write_tiny(path: Path) -> None:
    from mstar_orpheus.checkpoint import write_checkpoint

    write_checkpoint(path)


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    from mstar_orpheus.tokens import OrpheusTokens

    tokens = OrpheusTokens.from_dict(config["orpheus"])
    text = [int(config.get("bos_token_id", 128000)), *range(70, 82)]
    ids = torch.tensor([tokens.start_of_human, *text, *tokens.prompt_suffix])
    # 36 tokens: enough audio codes for two SNAC windows, so every walk runs.
    return [{"inputs": {"prompt_ids": ids}, "sampling": {"main": {"temperature": 0, "max_tokens": 36}}}]


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        name=MODEL_NAME,
        aliases=("orpheus-3b", "orpheus-tts"),
        architectures=(ARCHITECTURE,),
        load_config=load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=_write_tiny,
        default_placement={"lm": "0", "snac": "0"},
        max_model_len=lambda cfg: int(cfg["max_position_embeddings"]),
        example_requests=_example_requests,
    )


def _build_lm(config: dict[str, Any], checkpoint_dir: Path | None, device: str) -> Any:
    import torch

    from mstar_orpheus.config import lm_dtype
    from mstar_orpheus.lm_node import OrpheusLM
    from mstar_orpheus.weights import load_safetensors

    dtype = lm_dtype(config, device)
    if checkpoint_dir is None:
        lm = OrpheusLM(config, dtype)
        lm.init_random(float(config.get("initializer_range", 0.02)))
        return lm.to(device=device, dtype=dtype)
    with torch.device("meta"):  # no random init of weights about to be overwritten
        lm = OrpheusLM(config, dtype).to(dtype)
    lm = lm.to_empty(device=device)
    # Derived buffers some exports carry, and a tied head's duplicate, are not loaded.
    ignore = r"rotary_emb\.inv_freq$" + (r"|^lm_head\.weight$" if lm.tied else "")
    load_safetensors(lm, checkpoint_dir, ignore=ignore, desc="orpheus LM")
    return lm


def _build_snac(config: dict[str, Any], checkpoint_dir: Path | None, device: str) -> Any:
    from mstar_orpheus.snac_model import SnacDecoder
    from mstar_orpheus.snac_node import SnacNode
    from mstar_orpheus.weights import load_torch_bin

    node = SnacNode(config["snac"])
    if checkpoint_dir is not None:
        load_torch_bin(node.snac, Path(checkpoint_dir) / SNAC_DIR / "pytorch_model.bin", ignore=SnacDecoder.UNUSED_KEYS)
    return node.to(device)


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    return {"lm": _build_lm, "snac": _build_snac}


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    from mstar.sampling import SamplingParams

    from mstar_orpheus.tokens import OrpheusTokens

    tokens = OrpheusTokens.from_dict(config["orpheus"])
    return {
        "lm": NodeSamplers(
            vocab_size=int(config["vocab_size"]),
            # The official Orpheus defaults; max_tokens as in its generate().
            main=SamplingParams(temperature=0.6, top_p=0.8, repetition_penalty=1.3, max_tokens=1200),
            stop_token_ids=(tokens.end_of_speech,),
            prompt_signal="prompt_ids",
            withhold_on_stop=("code",),  # the end-of-speech token itself still reaches the client
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
    from mstar_orpheus.adapter import OrpheusApiAdapter

    if checkpoint_dir is None:
        raise ValueError("the Orpheus API adapter needs the checkpoint directory (its tokenizer.json)")
    return OrpheusApiAdapter(config, checkpoint_dir)
