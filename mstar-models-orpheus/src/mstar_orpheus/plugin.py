"""Orpheus's hook implementations (entry point ``orpheus`` in ``mstar.models``).

Graph: partition ``lm`` runs ``prefill`` then the ``decode`` loop; each step samples a
token and, for an accepted audio token, appends its SNAC code to the ``code`` stream.
Partition ``audio`` runs ``vocode``: every 7 codes from the 28th on, node ``snac`` decodes
the last 28 and emits 2048 samples at 24 kHz, while the LM keeps decoding (the engine runs
the two nodes' batches side by side: ``engine_defaults`` turns ``overlap_nodes`` on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import GraphSpec, Signal
from mstar.graph.shapes import prefill_decode_mixing, streaming_lm_graph
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig, lazy

from mstar_orpheus.audio_codes import OrpheusWindows
from mstar_orpheus.config import load_config

LM_OUTPUTS = ("token", "code")


def build_graph(config: dict[str, Any]) -> GraphSpec:
    return streaming_lm_graph(
        lm="lm",
        decoder="snac",
        request_inputs=("prompt_ids",),
        step_inputs=("token",),
        lm_outputs=LM_OUTPUTS,
        stream="code",
        chunk_policy=OrpheusWindows(),
        chunk_inputs=("code_window",),
        signals={
            "token": Signal("token", to_client=True, persist=True),
        },
    )


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
        load_config=load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=lazy("mstar_orpheus.checkpoint:write_checkpoint"),
        default_placement={"lm": "0", "snac": "0"},
        example_requests=_example_requests,
        # SNAC windows decode on a worker thread beside the LM's next step.
        engine_defaults={"overlap_nodes": True},
        float32_nodes=("snac",),  # the codec: audio quality, and it is small
    )


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    return {"lm": lazy("mstar_orpheus.factories:build_lm"), "snac": lazy("mstar_orpheus.factories:build_snac")}


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    from mstar.sampling import SamplingParams
    from mstar.text.lm import END_IDS

    from mstar_orpheus.tokens import OrpheusTokens

    tokens = OrpheusTokens.from_dict(config["orpheus"])
    return {
        "lm": NodeSamplers(
            vocab_size=int(config["vocab_size"]),
            # The official Orpheus defaults; max_tokens as in its generate().
            main=SamplingParams(temperature=0.6, top_p=0.8, repetition_penalty=1.3, max_tokens=1200),
            # End of speech, and the checkpoint's end ids, on which the official pipeline's vLLM stops too.
            stop_token_ids=tuple(dict.fromkeys((tokens.end_of_speech, *config.get(END_IDS, ())))),
            prompt_signal="prompt_ids",
            withhold_on_stop=("code",),  # the end-of-speech token itself still reaches the client
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
    from mstar_orpheus.adapter import OrpheusApiAdapter

    if checkpoint_dir is None:
        raise ValueError("the Orpheus API adapter needs the checkpoint directory (its tokenizer.json)")
    return OrpheusApiAdapter(config, checkpoint_dir)
