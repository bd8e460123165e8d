"""Hook implementations of the ``qwen3tts`` model (entry point in ``mstar.models``).

Graph: partition ``talker`` runs ``prefill`` then the ``decode`` loop on node ``talker``
(KV cache); each step emits one frame of codes [1, G] into the streaming edge ``codes``.
Partition ``audio`` runs ``vocode``: node ``codec`` (stateless) decodes left-context
chunks of that stream into 24 kHz audio until the stream closes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import GraphSpec, LeftContextChunks, Signal
from mstar.graph.shapes import prefill_decode_mixing, streaming_lm_graph
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig, lazy

from mstar_qwen3tts.config import BASE, CUSTOM_VOICE, Qwen3TTSConfig, load_config
from mstar_qwen3tts.factories import typed

REQUEST_INPUTS = ("text_ids", "codec_ids", "trailing_ids")
# Base checkpoints also take the clone prompt: the x-vector and the reference codes (the
# codec decodes the generated frames after them, as qwen-tts does, and drops their audio).
CLONE_INPUTS = ("speaker_embed", "ref_codes")


def build_graph(config: dict[str, Any]) -> GraphSpec:
    cfg = typed(config)
    s = cfg.streaming
    clone = cfg.tts_model_type == BASE
    return streaming_lm_graph(
        lm="talker",
        decoder="codec",
        request_inputs=REQUEST_INPUTS + (CLONE_INPUTS if clone else ()),
        step_inputs=("next_embed", "trailing_ids"),
        lm_outputs=("codes", "next_embed"),
        stream="codes",
        # A stateful codec carries its own past: chunks need no left context.
        chunk_policy=LeftContextChunks(s.chunk, 0 if s.stateful else s.left_context, s.first_chunk),
        chunk_inputs=("code_chunk", "code_context", *(("ref_codes",) if clone else ())),
        signals={"codes": Signal("codes", to_client=True), "next_embed": Signal("next_embed", persist=True)},
    )


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    """One request per prompt layout (and, for Base, per clone mode): together they run
    prefill, decode and vocode."""
    import torch

    from mstar_qwen3tts.prompt import build_clone_prompt, build_prompt

    cfg = typed(config)
    ids = _example_token_ids(cfg)
    sampling = {"talker": {"main": {"temperature": 0, "max_tokens": 4}, "aux": {"code_predictor": {"temperature": 0}}}}
    if cfg.tts_model_type == BASE:
        spk = torch.linspace(-1, 1, cfg.talker.hidden_size)
        groups = cfg.talker.num_code_groups
        ref = torch.arange(3 * groups).reshape(3, groups) % cfg.codec.codebook_size
        prompts = [build_clone_prompt(cfg, ids, spk, codes, text, "auto", layout)
                   for codes, text in ((ref, [1, 2]), (ref[:0], [])) for layout in (True, False)]
    else:
        speaker = cfg.speakers[0] if cfg.tts_model_type == CUSTOM_VOICE else None
        instruct = [cfg.im_start_token_id, 3, 4, cfg.im_end_token_id, 2] if cfg.supports_instructions else None
        prompts = [build_prompt(cfg, ids, speaker, "auto", layout, instruct) for layout in (True, False)]
    return [{"inputs": p.inputs(), "sampling": sampling} for p in prompts]


def _example_token_ids(cfg: Qwen3TTSConfig) -> list[int]:
    # Ids only need to be valid: role (3), two text tokens, tail (5).
    im_start, im_end = cfg.im_start_token_id, cfg.im_end_token_id
    return [im_start, 1, 2, 3, 4, im_end, 2, im_start, 1, 2]


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        load_config=load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=lazy("mstar_qwen3tts.tiny_checkpoint:write_checkpoint"),
        default_placement={"talker": "0", "codec": "0"},
        example_requests=_example_requests,
    )


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    return {"talker": lazy("mstar_qwen3tts.factories:build_talker"), "codec": lazy("mstar_qwen3tts.factories:build_codec")}


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    from mstar.sampling import SamplingParams

    from mstar_qwen3tts.code_predictor import AUX_LABEL

    cfg = typed(config)
    d = cfg.sampling
    main = SamplingParams(
        temperature=d.temperature if d.do_sample else 0.0,
        top_k=d.top_k,
        top_p=d.top_p,
        repetition_penalty=d.repetition_penalty,
        max_tokens=d.max_new_tokens,
        min_tokens=2,  # qwen-tts never lets the first two frames end the utterance
    )
    aux = SamplingParams(
        temperature=d.subtalker_temperature if d.subtalker_dosample else 0.0,
        top_k=d.subtalker_top_k,
        top_p=d.subtalker_top_p,
        max_tokens=d.max_new_tokens,
    )
    return {
        "talker": NodeSamplers(
            vocab_size=cfg.talker.vocab_size,
            main=main,
            aux={AUX_LABEL: aux},
            aux_vocab_sizes={AUX_LABEL: cfg.talker.predictor.vocab_size},  # type: ignore[union-attr]
            stop_token_ids=(cfg.talker.codec_eos_token_id,),
            withhold_on_stop=("codes", "next_embed"),
        )
    }


@hookimpl
def mstar_mixed_batch_configs(model_name: str, config: dict) -> list[MixedBatchConfig]:
    return prefill_decode_mixing("talker")


@hookimpl
def mstar_piecewise_graph_configs(model_name: str, node: str, submodule: Any) -> dict[str, PiecewiseGraphConfig]:
    if node != "talker":
        return {}
    from mstar_qwen3tts.talker import PIECEWISE_LABEL

    return {
        PIECEWISE_LABEL: PiecewiseGraphConfig(
            PIECEWISE_LABEL, submodule.sample_frame, ("hidden", "logits"), uses_sampler=True
        )
    }


@hookimpl
def mstar_api_adapter(model_name: str, config: dict, checkpoint_dir: Path | None) -> Any:
    from mstar_qwen3tts.adapter import Qwen3TTSApiAdapter

    return Qwen3TTSApiAdapter(config, checkpoint_dir)
