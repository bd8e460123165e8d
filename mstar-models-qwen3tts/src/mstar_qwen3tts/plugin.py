"""Hook implementations of the ``qwen3tts`` model (entry point in ``mstar.models``).

Graph: partition ``talker`` runs ``prefill`` then the ``decode`` loop on node ``talker``
(KV cache); each step emits one frame of codes [1, G] into the streaming edge ``codes``.
Partition ``audio`` runs ``vocode``: node ``codec`` (stateless) decodes left-context
chunks of that stream into 24 kHz audio until the stream closes.

Base (voice clone) checkpoints add the stateless nodes ``speaker_encoder`` and
``codec_encoder`` (``mstar_qwen3tts.encoder_nodes``): a request sent with its clip's
features (inputs ``ref_mel``, ``ref_wave``; kwarg ``clone_encode``) first runs walk
``encode_speaker`` (→ ``speaker_embed``) and, in-context, ``encode_reference`` (→
``ref_codes``) in partition ``talker``, batched with other requests' clips; a request with
a computed clone prompt (a saved voice) brings ``speaker_embed`` and ``ref_codes`` and
goes straight to the prefill. With kwarg ``encode_only`` (making a saved voice) only the
encoder walks run, and their outputs go to the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import EngineKind, GraphSpec, LeftContextChunks, NodeSpec, Signal, Step, Walk
from mstar.graph.shapes import DECODE, PREFILL, VOCODE, prefill_decode_mixing, streaming_lm_graph
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig, lazy

from mstar_qwen3tts.clone_kwargs import CLONE_ENCODE, ENCODE_ONLY, IN_CONTEXT, X_VECTOR_ONLY
from mstar_qwen3tts.config import BASE, CUSTOM_VOICE, Qwen3TTSConfig, load_config
from mstar_qwen3tts.factories import typed

REQUEST_INPUTS = ("text_ids", "codec_ids", "trailing_ids")
# Base checkpoints also read the clone prompt: the x-vector and the reference codes (the
# codec decodes the generated frames after them, as qwen-tts does, and drops their audio).
# They are request inputs (a saved voice) or outputs of the encoder nodes (a clip).
CLONE_INPUTS = ("speaker_embed", "ref_codes")
TALKER, AUDIO = "talker", "audio"  # partitions
SPEAKER_ENCODER, CODEC_ENCODER = "speaker_encoder", "codec_encoder"  # nodes (mstar_qwen3tts.encoder_nodes)
ENCODE_SPEAKER, ENCODE_REFERENCE = "encode_speaker", "encode_reference"  # their walks


@dataclass(frozen=True)
class CloneWalks:
    """Base checkpoints: partition ``talker`` runs the encoder walks kwarg ``clone_encode``
    asks for (none: the request brings ``speaker_embed`` and ``ref_codes``), then prefill
    and decode; partition ``audio`` runs vocode. With kwarg ``encode_only`` only the encoder
    walks run (a saved voice's clone prompt)."""

    def order(self, partition: str, request_kwargs: Mapping) -> tuple[str, ...]:
        encode = {None: (), X_VECTOR_ONLY: (ENCODE_SPEAKER,), IN_CONTEXT: (ENCODE_SPEAKER, ENCODE_REFERENCE)}
        mode = request_kwargs.get(CLONE_ENCODE)
        if mode not in encode:
            raise ValueError(f"kwarg {CLONE_ENCODE!r} must be {X_VECTOR_ONLY!r} or {IN_CONTEXT!r}, got {mode!r}")
        if request_kwargs.get(ENCODE_ONLY):
            if mode is None:
                raise ValueError(f"kwarg {ENCODE_ONLY!r} needs {CLONE_ENCODE!r}")
            return () if partition == AUDIO else encode[mode]
        return (VOCODE,) if partition == AUDIO else (*encode[mode], PREFILL, DECODE)

    def first_walk(self, partition: str, request_kwargs: Mapping) -> str | None:
        order = self.order(partition, request_kwargs)
        return order[0] if order else None

    def next_walk(self, partition: str, finished_walk: str, request_kwargs: Mapping) -> str | None:
        order = self.order(partition, request_kwargs)
        i = order.index(finished_walk)
        return order[i + 1] if i + 1 < len(order) else None

    def walks(self) -> set[str]:
        return {ENCODE_SPEAKER, ENCODE_REFERENCE, PREFILL, DECODE, VOCODE}


def build_graph(config: dict[str, Any]) -> GraphSpec:
    cfg = typed(config)
    s = cfg.streaming
    graph = streaming_lm_graph(
        lm=TALKER,
        decoder="codec",
        request_inputs=REQUEST_INPUTS,
        step_inputs=("next_embed", "trailing_ids"),
        lm_outputs=("codes", "next_embed"),
        stream="codes",
        # A stateful codec carries its own past: chunks need no left context.
        chunk_policy=LeftContextChunks(s.chunk, 0 if s.stateful else s.left_context, s.first_chunk),
        chunk_inputs=("code_chunk", "code_context"),
        signals={"codes": Signal("codes", to_client=True), "next_embed": Signal("next_embed", persist=True)},
        decoder_partition=AUDIO,
    )
    if cfg.tts_model_type == BASE:
        _add_clone_encoders(graph)
    return graph


def _add_clone_encoders(graph: GraphSpec) -> None:
    """The encoder nodes and walks. The prefill and the codec read ``speaker_embed`` and
    ``ref_codes`` from the request's signals, not as step inputs: a request either brings
    them or runs the walks that make them first (a missing one fails the prefill, naming it)."""
    for node in (SPEAKER_ENCODER, CODEC_ENCODER):
        graph.nodes[node] = NodeSpec(node, EngineKind.STATELESS)
    for name in CLONE_INPUTS:  # to the client only when asked for (making a voice)
        graph.signals[name] = Signal(name, to_client=True, persist=True)
    # Like Qwen3-Omni's encoders: the clip's features are optional request inputs, which a
    # graph cannot declare, so a step waits on the prompt (always there) and reads them.
    graph.walks[ENCODE_SPEAKER] = Walk(ENCODE_SPEAKER, TALKER, Step(SPEAKER_ENCODER, ("text_ids",), ("speaker_embed",)))
    graph.walks[ENCODE_REFERENCE] = Walk(ENCODE_REFERENCE, TALKER, Step(CODEC_ENCODER, ("text_ids",), ("ref_codes",)))
    graph.state_machine = CloneWalks()


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    """One request per prompt layout (and, for Base, per clone mode, plus a clip's features
    through each encoder walk): together they run every walk."""
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
        return [{"inputs": p.inputs(), "sampling": sampling} for p in prompts] + _encoder_requests(config, ids, sampling)
    else:
        speaker = cfg.speakers[0] if cfg.tts_model_type == CUSTOM_VOICE else None
        instruct = [cfg.im_start_token_id, 3, 4, cfg.im_end_token_id, 2] if cfg.supports_instructions else None
        prompts = [build_prompt(cfg, ids, speaker, "auto", layout, instruct) for layout in (True, False)]
    return [{"inputs": p.inputs(), "sampling": sampling} for p in prompts]


def _encoder_requests(config: dict[str, Any], ids: list[int], sampling: dict[str, Any]) -> list[dict[str, Any]]:
    """Base: a clip's features through the encoder walks, x-vector only and in-context."""
    import torch

    from mstar_qwen3tts.clone_loading import codec_encoder_rates, reference_frames
    from mstar_qwen3tts.encoder_nodes import REF_MEL, REF_WAVE
    from mstar_qwen3tts.prompt import clone_prompt_layout

    cfg = typed(config)
    _, per_frame = codec_encoder_rates(config)
    mel = torch.linspace(-4, 0, 8 * cfg.speaker_encoder.mel_dim).reshape(8, -1)
    wave = 0.1 * torch.sin(torch.arange(2 * per_frame + 7, dtype=torch.float32) / 9)
    frames = reference_frames(config, wave.numel())
    xvec = clone_prompt_layout(cfg, ids, 0, [], "auto", True).inputs()
    icl = clone_prompt_layout(cfg, ids, frames, [1, 2], "auto", True).inputs()
    empty = torch.zeros(0, cfg.talker.num_code_groups, dtype=torch.long)
    return [
        {"inputs": {**xvec, REF_MEL: mel, "ref_codes": empty}, "kwargs": {CLONE_ENCODE: X_VECTOR_ONLY}, "sampling": sampling},
        {"inputs": {**icl, REF_MEL: mel, REF_WAVE: wave}, "kwargs": {CLONE_ENCODE: IN_CONTEXT}, "sampling": sampling},
    ]


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
        # The encoders (Base only) sit with the talker: their walks are in its partition.
        default_placement={"talker": "0", "codec": "0", SPEAKER_ENCODER: "0", CODEC_ENCODER: "0"},
        example_requests=_example_requests,
        engine_defaults={"overlap_nodes": True},  # the codec decodes beside the talker's next step
        # Audio in and out in float32 whatever --dtype says: quality, and they are small.
        float32_nodes=("codec", SPEAKER_ENCODER, CODEC_ENCODER),
    )


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    factories = {"talker": lazy("mstar_qwen3tts.factories:build_talker"), "codec": lazy("mstar_qwen3tts.factories:build_codec")}
    if typed(config).tts_model_type == BASE:
        factories[SPEAKER_ENCODER] = lazy("mstar_qwen3tts.encoder_nodes:build_speaker_encoder")
        factories[CODEC_ENCODER] = lazy("mstar_qwen3tts.encoder_nodes:build_codec_encoder")
    return factories


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
            # qwen-tts's generate: eos_token_id defaults to talker_config.codec_eos_token_id (no text end ids).
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
