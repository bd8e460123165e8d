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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import EngineKind, GraphSpec, NodeSpec, Signal, Step, Walk
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers

from mstar_qwen3omni.config import ARCHITECTURE, load_config

MODEL_NAME = "qwen3omni"
THINKER, AUDIO_ENCODER, VISION_ENCODER = "thinker", "audio_encoder", "vision_encoder"
GENERATION_CONFIG = "generation_config"
MEDIA = "media"  # request kwarg: the kinds of media the request carries
MEDIA_KINDS = ("audio", "image", "video")  # their encoder walks run in this order


@dataclass(frozen=True)
class ThinkerWalks:
    """The request's encoder walks (from kwarg ``media``), then prefill and decode."""

    def order(self, request_kwargs: Mapping) -> tuple[str, ...]:
        media = set(request_kwargs.get(MEDIA) or ())
        unknown = media - set(MEDIA_KINDS)
        if unknown:
            raise ValueError(f"unknown media kind(s) {sorted(unknown)} in kwarg {MEDIA!r}; known: {list(MEDIA_KINDS)}")
        return (*(f"encode_{k}" for k in MEDIA_KINDS if k in media), "prefill", "decode")

    def first_walk(self, partition: str, request_kwargs: Mapping) -> str | None:
        return self.order(request_kwargs)[0]

    def next_walk(self, partition: str, finished_walk: str, request_kwargs: Mapping) -> str | None:
        order = self.order(request_kwargs)
        i = order.index(finished_walk)
        return order[i + 1] if i + 1 < len(order) else None

    def walks(self) -> set[str]:
        return {*(f"encode_{k}" for k in MEDIA_KINDS), "prefill", "decode"}


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
    walks = {name: Walk(name, THINKER, Step(node, (PROMPT,), outputs)) for name, (node, _, outputs) in encode.items()}
    # Encoder outputs persist until the prefill (a later walk) reads them.
    signals = {name: Signal(name, persist=True) for _, _, outputs in encode.values() for name in outputs}
    return GraphSpec(
        nodes={
            **text.nodes,
            AUDIO_ENCODER: NodeSpec(AUDIO_ENCODER, EngineKind.STATELESS),
            VISION_ENCODER: NodeSpec(VISION_ENCODER, EngineKind.STATELESS),
        },
        signals={**text.signals, **signals},
        walks={**walks, **text.walks},
        state_machine=ThinkerWalks(),
        request_inputs=text.request_inputs,
    )


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
    """A text request, and one with an image, a video and an audio (every walk runs)."""
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
    body = [
        t.vision_start_token_id, *[t.image_token_id] * 4, t.vision_end_token_id,
        t.vision_start_token_id, *[t.video_token_id] * 8, t.vision_end_token_id,
        t.audio_start_token_id, *[t.audio_token_id] * n_audio, t.audio_end_token_id,
    ]
    greedy = {"main": {"temperature": 0, "max_tokens": 4}}
    media = {
        "prompt_ids": torch.tensor(head + body + tail),
        "pixel_values": torch.randn(int(image.prod()), width), "image_grid_thw": image,
        "pixel_values_videos": torch.randn(int(video.prod()), width), "video_grid_thw": video,
        "video_second_per_grid": torch.tensor([1.0]),
        "input_features": torch.randn(1, mels, frames), "feature_attention_mask": torch.ones(1, frames, dtype=torch.long),
    }
    return [
        {"inputs": {"prompt_ids": torch.tensor(head + tail)}, "sampling": greedy},
        {"inputs": media, "sampling": greedy, "kwargs": {MEDIA: list(MEDIA_KINDS)}},
    ]


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        name=MODEL_NAME,
        aliases=("qwen3-omni",),
        architectures=(ARCHITECTURE,),
        load_config=_load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=_write_tiny,
        default_placement={THINKER: "0", AUDIO_ENCODER: "0", VISION_ENCODER: "0"},
        example_requests=_example_requests,
    )


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    from mstar_qwen3omni.encoder_nodes import build_audio_encoder, build_vision_encoder
    from mstar_qwen3omni.loading import build_thinker

    return {THINKER: build_thinker, AUDIO_ENCODER: build_audio_encoder, VISION_ENCODER: build_vision_encoder}


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
    from mstar_qwen3omni.adapter import OmniChatAdapter, limits_from_env

    if checkpoint_dir is None:
        raise ValueError("the Qwen3-Omni API adapter needs the checkpoint directory (tokenizer, chat template, processor)")
    return OmniChatAdapter(checkpoint_dir, text_view(config), THINKER, limits_from_env())


@hookimpl
def mstar_offload_preprocess(model_name: str, request: Any) -> bool | None:
    """Media decoding and features run in the preprocess pool; a text-only chat is a
    template and a tokenizer call, cheaper inline than a trip to a worker."""
    from mstar_qwen3omni.adapter import has_media

    messages = getattr(request, "messages", None)
    if messages is None:
        return None
    return any(has_media(m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m) for m in messages)
