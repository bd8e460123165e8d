"""Qwen3-Omni's hook implementations (entry point ``qwen3omni`` in ``mstar.models``).

Graph: partition ``thinker`` runs, per request, the encoder walks its media need
(``encode_audio`` on node ``audio_encoder``, ``encode_image`` / ``encode_video`` on node
``vision_encoder``; request kwarg ``media``, e.g. ``["image", "audio"]``), then ``prefill``
and the ``decode`` loop on the KV node ``thinker`` (``mstar.text.lm``'s text-LLM signals).
Encoder rows of many requests run as one batch; the encoders run once per request, before
the prefill, however many chunks the prefill takes. Prefill and decode rows of different
requests share one forward (a mixed batch).

Speech out (checkpoints with ``talker_config`` and ``code2wav_config``; request kwarg
``modalities`` containing ``"audio"``): the Thinker runs ``speech_prefill`` /
``speech_decode`` instead, which also stream what the Talker reads (``talker_prompt``: the
prompt rows, ``thinker_embed``: the embedding of each token fed back) into partition
``talker`` (walks ``talker_prefill``, ``talker_decode`` on KV node ``talker``), whose frames
stream into partition ``code2wav`` (walk ``vocode``, stateful streaming node ``code2wav``).
A text-only request never runs or reaches the Talker and Code2Wav.

Engine request (``Engine.add_request``):

- inputs: ``prompt_ids`` and the processor's media tensors, as for text out;
- kwargs: ``media`` as above; ``modalities``: ``["text"]`` (default) or
  ``["text", "audio"]``; ``voice``: a speaker of the checkpoint's
  ``talker_config.speaker_id`` (case-insensitive; default ``Ethan`` when listed, else the
  first); an unknown voice, or audio from a checkpoint without a Talker, is a ValueError
  naming what is valid;
- sampling, per node and label: ``{"thinker": {"main": {...}}, "talker": {"main": {...},
  "aux": {"code_predictor": {...}}}}`` (Talker defaults: transformers'
  ``generate(return_audio=True)``: temperature 0.9, top_k 50, repetition_penalty 1.05;
  code predictor: temperature 1, top_k 50, top_p 0.8; the Talker stops at codec EOS).

Output signals (events in order per signal):

- ``tokens`` [1] int: the Thinker's text ids, one per step (the end token withheld);
- ``codes`` [1, G] int: one Talker frame per step, G codebook groups (the codec-EOS frame
  withheld);
- ``audio`` [n] float32: mono PCM at 24 kHz, in chunks as Code2Wav decodes the frames;
  the chunks joined equal one whole decode of all frames.

A speech request's ``finish_reason`` is the first stop of any node (the Talker may stop
before the Thinker); the text stopped at ``max_tokens`` exactly when it has that many tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import EngineKind, GraphSpec, NodeSpec, Signal, Step, Walk
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig, lazy

from mstar_qwen3omni.config import ARCHITECTURE, has_speech, load_config

MODEL_NAME = "qwen3omni"
THINKER, AUDIO_ENCODER, VISION_ENCODER = "thinker", "audio_encoder", "vision_encoder"
TALKER, CODE2WAV = "talker", "code2wav"  # nodes, and the partitions they run in
GENERATION_CONFIG = "generation_config"
MEDIA = "media"  # request kwarg: the kinds of media the request carries
MEDIA_KINDS = ("audio", "image", "video")  # their encoder walks run in this order
MODALITIES, VOICE = "modalities", "voice"  # request kwargs: output modalities, speaker
OUTPUT_MODALITIES = ("text", "audio")
SPEECH_PREFILL, SPEECH_DECODE = "speech_prefill", "speech_decode"  # the Thinker's, for speech out
TALKER_PREFILL, TALKER_DECODE, VOCODE = "talker_prefill", "talker_decode", "vocode"
# Signals between the partitions (thinker -> talker -> code2wav) and out.
TALKER_PROMPT, THINKER_EMBED = "talker_prompt", "thinker_embed"
PROMPT_ROWS, TEXT_EMBED, TEXT_ENDED = "talker_prompt_rows", "thinker_text_embed", "thinker_text_ended"
CODES, FRAME_EMBED, CODE_CHUNK, AUDIO = "codes", "frame_embed", "code_chunk", "audio"
# transformers' ``Qwen3OmniMoeForConditionalGeneration.generate(thinker_eos_token_id=151645)``:
# the Thinker's end id (``<|im_end|>`` in the released vocabulary), whatever the checkpoint names.
THINKER_EOS_TOKEN_ID = 151645
# Code2Wav chunks (frames): a short first one so audio starts early, then longer ones. The
# node carries its own past, so the chunks need no left context and join to the whole decode.
FIRST_CHUNK, CHUNK = 4, 16


# Media kinds each encoder tower takes (checkpoint_keys.TOWER_PREFIXES: where its weights are).
TOWER_KINDS = {"audio": ("audio",), "vision": ("image", "video")}
ENCODERS = "mstar_encoders"  # config key set on load: the towers the checkpoint's weights hold


def checkpoint_towers(checkpoint_dir: Path) -> list[str]:
    """The encoder towers whose weights the checkpoint holds."""
    from mstar.weights import SafetensorsSource

    from mstar_qwen3omni.checkpoint_keys import TOWER_PREFIXES

    keys = SafetensorsSource(checkpoint_dir).weight_map
    return [t for t, prefix in TOWER_PREFIXES.items() if any(k.startswith(prefix) for k in keys)]


def media_kinds(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The media kinds this checkpoint takes (all of them for a config not loaded from files)."""
    towers = config.get(ENCODERS, tuple(TOWER_KINDS))
    return tuple(k for k in MEDIA_KINDS if any(k in TOWER_KINDS[t] for t in towers))


def wants_audio(request_kwargs: Mapping) -> bool:
    modalities = request_kwargs.get(MODALITIES) or ("text",)
    if isinstance(modalities, str):
        modalities = (modalities,)
    unknown = set(modalities) - set(OUTPUT_MODALITIES)
    if unknown:
        raise ValueError(f"unknown output modality(ies) {sorted(unknown)} in kwarg {MODALITIES!r}; known: {list(OUTPUT_MODALITIES)}")
    return "audio" in modalities


@dataclass(frozen=True)
class ThinkerWalks:
    """The request's encoder walks (from kwarg ``media``), then prefill and decode (their
    speech variants when kwarg ``modalities`` asks for audio); for audio, partition
    ``talker`` runs its prefill and decode and partition ``code2wav`` decodes the frames.
    ``speakers``: the checkpoint's voices (empty: it cannot speak)."""

    speakers: tuple[str, ...] = ()
    kinds: tuple[str, ...] = MEDIA_KINDS  # the media kinds the checkpoint has encoders for

    def order(self, request_kwargs: Mapping) -> tuple[str, ...]:
        media = set(request_kwargs.get(MEDIA) or ())
        unknown = media - set(MEDIA_KINDS)
        if unknown:
            raise ValueError(f"unknown media kind(s) {sorted(unknown)} in kwarg {MEDIA!r}; known: {list(MEDIA_KINDS)}")
        if media - set(self.kinds):
            raise ValueError(f"this checkpoint has no encoder for media kind(s) {sorted(media - set(self.kinds))} "
                             f"(kwarg {MEDIA!r}); it takes {list(self.kinds)}")
        lm = (SPEECH_PREFILL, SPEECH_DECODE) if self.speech(request_kwargs) else ("prefill", "decode")
        return (*(f"encode_{k}" for k in self.kinds if k in media), *lm)

    def speech(self, request_kwargs: Mapping) -> bool:
        if not wants_audio(request_kwargs):
            return False
        if not self.speakers:
            raise ValueError("this checkpoint has no Talker: it answers in text only (modalities ['text'])")
        voice = request_kwargs.get(VOICE)
        if voice is not None and str(voice).lower() not in self.speakers:
            raise ValueError(f"unknown voice {voice!r}; this checkpoint has {list(self.speakers)}")
        return True

    def partition_order(self, partition: str, request_kwargs: Mapping) -> tuple[str, ...]:
        if partition == THINKER:
            return self.order(request_kwargs)
        if not self.speech(request_kwargs):
            return ()
        return {TALKER: (TALKER_PREFILL, TALKER_DECODE), CODE2WAV: (VOCODE,)}.get(partition, ())

    def first_walk(self, partition: str, request_kwargs: Mapping) -> str | None:
        order = self.partition_order(partition, request_kwargs)
        return order[0] if order else None

    def next_walk(self, partition: str, finished_walk: str, request_kwargs: Mapping) -> str | None:
        order = self.partition_order(partition, request_kwargs)
        i = order.index(finished_walk)
        return order[i + 1] if i + 1 < len(order) else None

    def walks(self) -> set[str]:
        speech = {SPEECH_PREFILL, SPEECH_DECODE, TALKER_PREFILL, TALKER_DECODE, VOCODE} if self.speakers else set()
        return {*(f"encode_{k}" for k in self.kinds), "prefill", "decode", *speech}


def speakers(config: Mapping[str, Any]) -> tuple[str, ...]:
    if not has_speech(config):
        return ()
    return tuple(str(k).lower() for k in (config["talker_config"].get("speaker_id") or {}))


def build_graph(config: dict[str, Any]) -> GraphSpec:
    from mstar.text.lm import PROMPT, text_lm_graph

    from mstar_qwen3omni import encoder_nodes as enc

    text = text_lm_graph(THINKER)
    encode = {
        enc.ENCODE_AUDIO: (AUDIO_ENCODER, enc.AUDIO_INPUTS, enc.AUDIO_OUTPUTS),
        enc.ENCODE_IMAGE: (VISION_ENCODER, enc.IMAGE_INPUTS, enc.IMAGE_OUTPUTS),
        enc.ENCODE_VIDEO: (VISION_ENCODER, enc.VIDEO_INPUTS, enc.VIDEO_OUTPUTS),
    }
    # The processor's tensors are optional request inputs, which a graph cannot declare: an
    # encoder step waits on the prompt (always there) and reads its tensors from the request.
    kinds = media_kinds(config)  # a checkpoint without a tower has neither its node nor its walks
    encode = {name: e for name, e in encode.items() if name.removeprefix("encode_") in kinds}
    walks = {name: Walk(name, THINKER, Step(node, (PROMPT,), outputs)) for name, (node, _, outputs) in encode.items()}
    # Encoder outputs persist until the prefill (a later walk) reads them.
    signals = {name: Signal(name, persist=True) for _, _, outputs in encode.values() for name in outputs}
    encoders = {node for node, _, _ in encode.values()}
    nodes = {**text.nodes, **{n: NodeSpec(n, EngineKind.STATELESS) for n in (AUDIO_ENCODER, VISION_ENCODER) if n in encoders}}
    if has_speech(config):
        speech_nodes, speech_walks, speech_signals = _speech_graph()
        nodes, walks, signals = {**nodes, **speech_nodes}, {**walks, **speech_walks}, {**signals, **speech_signals}
    return GraphSpec(
        nodes=nodes,
        signals={**text.signals, **signals},
        walks={**walks, **text.walks},
        state_machine=ThinkerWalks(speakers(config), kinds),
        request_inputs=text.request_inputs,
    )


def _speech_graph() -> tuple[dict[str, NodeSpec], dict[str, Walk], dict[str, Signal]]:
    """The Thinker's speech walks (text plus what the Talker reads, streamed), the Talker's
    walks, and Code2Wav decoding the Talker's frames as they come."""
    from mstar.graph import FixedChunks, LeftContextChunks, Loop, StreamingEdge
    from mstar.text.lm import PROMPT, STEP_OUTPUTS, TOKENS

    talker_step = Step(TALKER, (FRAME_EMBED, TEXT_EMBED), (CODES, FRAME_EMBED))
    walks = {
        SPEECH_PREFILL: Walk(SPEECH_PREFILL, THINKER, Step(THINKER, (PROMPT,), (*STEP_OUTPUTS, TALKER_PROMPT))),
        SPEECH_DECODE: Walk(SPEECH_DECODE, THINKER, Loop(
            "speech_decode_loop", Step(THINKER, (TOKENS,), (*STEP_OUTPUTS, THINKER_EMBED)), stop_on=(THINKER,)
        )),
        TALKER_PREFILL: Walk(TALKER_PREFILL, TALKER, Step(TALKER, (PROMPT_ROWS, TEXT_EMBED, PROMPT), (CODES, FRAME_EMBED))),
        TALKER_DECODE: Walk(TALKER_DECODE, TALKER, Loop("talker_decode_loop", talker_step, stop_on=(TALKER,))),
        VOCODE: Walk(VOCODE, CODE2WAV, Loop(
            "vocode_loop", Step(CODE2WAV, (CODE_CHUNK,), (AUDIO,)), until_stream_closed=CODES
        )),
    }
    signals = {
        TALKER_PROMPT: Signal(TALKER_PROMPT, stream=StreamingEdge(TALKER, PROMPT_ROWS, FixedChunks(1))),
        # One Thinker embedding per Talker step; past the Thinker's end the Talker goes on
        # (tts_eos, then tts_pad) until it draws codec EOS.
        THINKER_EMBED: Signal(THINKER_EMBED, stream=StreamingEdge(TALKER, TEXT_EMBED, FixedChunks(1), past_end_signal=TEXT_ENDED)),
        CODES: Signal(CODES, to_client=True, stream=StreamingEdge(CODE2WAV, CODE_CHUNK, LeftContextChunks(CHUNK, 0, FIRST_CHUNK))),
        FRAME_EMBED: Signal(FRAME_EMBED, persist=True),
        AUDIO: Signal(AUDIO, to_client=True),
    }
    nodes = {TALKER: NodeSpec(TALKER, EngineKind.KV_CACHE), CODE2WAV: NodeSpec(CODE2WAV, EngineKind.STATELESS)}
    return nodes, walks, signals


def text_view(config: dict[str, Any]) -> dict[str, Any]:
    """The Thinker's text config with the checkpoint's generation config and end ids: the flat
    keys ``mstar.text`` reads (vocab_size, max_position_embeddings, end ids)."""
    from mstar.text.lm import END_IDS, end_token_ids

    view = {**config["thinker_config"]["text_config"], GENERATION_CONFIG: config.get(GENERATION_CONFIG) or {}}
    # transformers' generate passes its thinker_eos_token_id to the Thinker's generate, which
    # wins over generation_config.json (the release's names none anyway).
    return {**view, END_IDS: list(end_token_ids(view, reference_end_ids=THINKER_EOS_TOKEN_ID, reference_passes_them=True))}


def _load_config(checkpoint_dir: Path) -> dict[str, Any]:
    config = {**load_config(checkpoint_dir), ENCODERS: checkpoint_towers(Path(checkpoint_dir))}
    gen = Path(checkpoint_dir) / "generation_config.json"
    return {**config, GENERATION_CONFIG: json.loads(gen.read_text())} if gen.is_file() else config


def _write_tiny(path: Path) -> None:
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint

    write_checkpoint(path)


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    """A text request (spoken, when the checkpoint can speak), and one with an image, a video
    and an audio answered in text: together every walk runs."""
    import torch

    from mstar_qwen3omni.config import MultimodalTokens
    from mstar_qwen3omni.positions import audio_token_count

    t, vision = MultimodalTokens.from_config(config), config["thinker_config"]["vision_config"]
    mels = config["thinker_config"]["audio_config"].get("num_mel_bins", 128)
    width = vision.get("in_channels", 3) * vision.get("temporal_patch_size", 2) * vision.get("patch_size", 16) ** 2
    merge = t.spatial_merge_size
    image, video = torch.tensor([[1, 2 * merge, 2 * merge]]), torch.tensor([[2, 2 * merge, 2 * merge]])
    frames = 40
    n_audio = int(audio_token_count(torch.tensor(frames), t.audio_n_window))
    head, tail = [151644, 872, 198], [100, 101, 151645, 198, 151644, 77091, 198]  # released chat ids
    parts = {  # per media kind: its placeholders and processor tensors
        "image": ([t.vision_start_token_id, *[t.image_token_id] * 4, t.vision_end_token_id],
                  {"pixel_values": torch.randn(int(image.prod()), width), "image_grid_thw": image}),
        "video": ([t.vision_start_token_id, *[t.video_token_id] * 8, t.vision_end_token_id],
                  {"pixel_values_videos": torch.randn(int(video.prod()), width), "video_grid_thw": video,
                   "video_second_per_grid": torch.tensor([1.0])}),
        "audio": ([t.audio_start_token_id, *[t.audio_token_id] * n_audio, t.audio_end_token_id],
                  {"input_features": torch.randn(1, mels, frames), "feature_attention_mask": torch.ones(1, frames, dtype=torch.long)}),
    }
    kinds = [k for k in ("image", "video", "audio") if k in media_kinds(config)]
    body = [i for k in kinds for i in parts[k][0]]
    greedy = {THINKER: {"main": {"temperature": 0, "max_tokens": 4}}}
    media = {"prompt_ids": torch.tensor(head + body + tail), **{n: v for k in kinds for n, v in parts[k][1].items()}}
    text_out = {"inputs": media, "sampling": greedy, "kwargs": {MEDIA: kinds}}
    if not has_speech(config):
        return [{"inputs": {"prompt_ids": torch.tensor(head + tail)}, "sampling": greedy}, text_out]
    speech = {**greedy, TALKER: {"main": {"temperature": 0, "max_tokens": 4}, "aux": {"code_predictor": {"temperature": 0}}}}
    # Speech first: conformance's stop-rule check reads every sampling node in the first one.
    return [{"inputs": {"prompt_ids": torch.tensor(head + tail)}, "sampling": speech, "kwargs": {MODALITIES: ["text", "audio"]}}, text_out]


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        name=MODEL_NAME,
        aliases=("qwen3-omni",),
        architectures=(ARCHITECTURE,),
        load_config=_load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=_write_tiny,
        default_placement={THINKER: "0", AUDIO_ENCODER: "0", VISION_ENCODER: "0", TALKER: "0", CODE2WAV: "0"},
        example_requests=_example_requests,
        float32_nodes=(CODE2WAV,),  # audio quality; it is small
    )


def _build_talker(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    import torch

    from mstar_qwen3omni.speech_loading import build_talker

    return build_talker(config, checkpoint_dir, device, prefill_walks=(TALKER_PREFILL,), dtype=dtype or torch.float32)


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    from mstar_qwen3omni.encoder_nodes import build_audio_encoder, build_vision_encoder
    from mstar_qwen3omni.loading import build_thinker

    factories = {THINKER: build_thinker, AUDIO_ENCODER: build_audio_encoder, VISION_ENCODER: build_vision_encoder}
    if has_speech(config):
        factories |= {TALKER: _build_talker, CODE2WAV: lazy("mstar_qwen3omni.speech_loading:build_code2wav_node")}
    return factories


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    from dataclasses import replace

    from mstar.text.lm import STEP_OUTPUTS, text_lm_samplers

    gen = config.get(GENERATION_CONFIG) or {}
    defaults = {k: gen[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty") if k in gen}
    samplers = text_lm_samplers(text_view(config), THINKER, **{"max_tokens": 1024, **defaults})
    if not has_speech(config):
        return samplers
    # The Thinker's end token stays unsent, but the embedding of the token its last step fed
    # back still goes to the Talker (it is spoken).
    samplers[THINKER] = replace(samplers[THINKER], withhold_on_stop=STEP_OUTPUTS)
    return {**samplers, **_talker_samplers(config)}


def _talker_samplers(config: dict[str, Any]) -> dict[str, NodeSamplers]:
    from mstar.sampling import SamplingParams

    from mstar_qwen3omni.code_predictor import AUX_LABEL, AUX_SAMPLING_DEFAULTS
    from mstar_qwen3omni.talker import SAMPLING_DEFAULTS
    from mstar_qwen3omni.talker_config import TalkerConfig

    cfg = TalkerConfig.from_config(config)
    return {
        TALKER: NodeSamplers(
            vocab_size=cfg.vocab_size,
            main=SamplingParams(**SAMPLING_DEFAULTS),
            aux={AUX_LABEL: SamplingParams(**AUX_SAMPLING_DEFAULTS)},
            aux_vocab_sizes={AUX_LABEL: cfg.predictor.vocab_size},
            stop_token_ids=(cfg.codec_eos_id,),  # generate(return_audio=True): the Talker's eos_token_id
            withhold_on_stop=(CODES,),
        )
    }


@hookimpl
def mstar_mixed_batch_configs(model_name: str, config: dict) -> list[MixedBatchConfig]:
    """Thinker prefill and decode rows (text and speech walks) in one forward; Talker
    prefills beside Talker decode steps."""
    thinker = MixedBatchConfig(node=THINKER, walks=("prefill", "decode", SPEECH_PREFILL, SPEECH_DECODE), merged_walk="mixed")
    if not has_speech(config):
        return [MixedBatchConfig(node=THINKER, walks=("prefill", "decode"), merged_walk="mixed")]
    talker = MixedBatchConfig(node=TALKER, walks=(TALKER_PREFILL, TALKER_DECODE), merged_walk="talker_mixed", max_rows={TALKER_PREFILL: 4})
    return [thinker, talker]


@hookimpl
def mstar_piecewise_graph_configs(model_name: str, node: str, submodule: Any) -> dict[str, PiecewiseGraphConfig]:
    """The Talker's code predictor loop (residual codes under the aux label) as a region."""
    if node != TALKER:
        return {}
    from mstar_qwen3omni.talker import PIECEWISE_LABEL

    return {PIECEWISE_LABEL: PiecewiseGraphConfig(PIECEWISE_LABEL, submodule.lm.sample_frame, ("hidden", "logits"), uses_sampler=True)}


@hookimpl
def mstar_api_adapter(model_name: str, config: dict, checkpoint_dir: Path | None) -> Any:
    from mstar_qwen3omni.adapter import OmniChatAdapter, limits_from_env, speaker_names

    if checkpoint_dir is None:
        raise ValueError("the Qwen3-Omni API adapter needs the checkpoint directory (tokenizer, chat template, processor)")
    # A checkpoint with a Talker answers in speech too (chat audio, /v1/audio/speech).
    speakers = speaker_names(config) if has_speech(config) else ()
    from mstar_qwen3omni.config import MultimodalTokens

    audio_id = MultimodalTokens.from_config(config).audio_token_id
    return OmniChatAdapter(checkpoint_dir, text_view(config), THINKER, limits_from_env(), speakers, media_kinds(config), audio_id)


@hookimpl
def mstar_offload_preprocess(model_name: str, request: Any) -> bool | None:
    """Media decoding and features run in the preprocess pool; a text-only chat is a
    template and a tokenizer call, cheaper inline than a trip to a worker."""
    from mstar_qwen3omni.adapter import has_media

    messages = getattr(request, "messages", None)
    if messages is None:
        return None
    return any(has_media(m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m) for m in messages)
