"""Reading a Qwen3-Omni checkpoint's ``config.json`` (every size comes from here).

Layout (``--weights DIR``)::

    DIR/config.json          Qwen3OmniMoeForConditionalGeneration config (thinker_config.{text,audio,vision}_config)
    DIR/model.safetensors    or model-*.safetensors + model.safetensors.index.json; keys thinker.* (talker.*, code2wav.*)
    DIR/tokenizer.json or vocab.json + merges.txt, tokenizer_config.json; the chat template in chat_template.json,
        chat_template.jinja or tokenizer_config.json (mstar.text.chat_template); preprocessor_config.json or
        processor_config.json (mstar.processor_config); generation_config.json (optional)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"


def load_config(checkpoint_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json, checked to hold a Thinker."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"Qwen3-Omni checkpoint lacks its config: {path} does not exist")
    config = json.loads(path.read_text())
    if ARCHITECTURE not in config.get("architectures", []):
        raise ValueError(f"{path} is not a Qwen3-Omni checkpoint (architectures: {config.get('architectures')})")
    thinker = config.get("thinker_config")
    if not isinstance(thinker, dict) or not isinstance(thinker.get("text_config"), dict):
        raise ValueError(f"{path} has no thinker_config.text_config")
    return config


def thinker_config(config: dict[str, Any]) -> dict[str, Any]:
    return config["thinker_config"]


def _rope(text: dict[str, Any]) -> tuple[float, tuple[int, int, int]]:
    """(rope_theta, mrope_section) from ``rope_parameters`` (transformers 5) or the released
    ``rope_theta`` + ``rope_scaling`` keys."""
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", text.get("rope_theta", 1_000_000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"unsupported rope_type {rope_type!r} for the Thinker (M-RoPE uses 'default')")
    if params.get("mrope_interleaved", params.get("interleaved", True)) is False:
        raise ValueError("only the interleaved M-RoPE layout of Qwen3-Omni is supported (mrope_interleaved=false)")
    section = tuple(int(s) for s in params.get("mrope_section", (24, 20, 20)))
    if len(section) != 3:
        raise ValueError(f"mrope_section must have 3 entries (t, h, w), got {list(section)}")
    return theta, section  # type: ignore[return-value]


@dataclass(frozen=True)
class TextConfig:
    """The Thinker LLM's sizes (``thinker_config.text_config``)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, int, int]
    max_position_embeddings: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    attention_bias: bool
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TextConfig:
        thinker = thinker_config(config)
        t = thinker["text_config"]
        if t.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {t.get('hidden_act')!r} (the Thinker uses silu)")
        theta, section = _rope(t)
        head_dim = int(t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"])
        if 2 * sum(section) != head_dim:
            raise ValueError(f"mrope_section {list(section)} does not cover head_dim {head_dim} (needs sum = head_dim/2)")
        return cls(
            vocab_size=int(t["vocab_size"]),
            hidden_size=int(t["hidden_size"]),
            intermediate_size=int(t["intermediate_size"]),
            num_layers=int(t["num_hidden_layers"]),
            num_heads=int(t["num_attention_heads"]),
            num_kv_heads=int(t["num_key_value_heads"]),
            head_dim=head_dim,
            rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            mrope_section=section,
            max_position_embeddings=int(t.get("max_position_embeddings", 32768)),
            num_experts=int(t.get("num_experts", 0)),
            num_experts_per_tok=int(t.get("num_experts_per_tok", 0)),
            moe_intermediate_size=int(t.get("moe_intermediate_size", 0)),
            norm_topk_prob=bool(t.get("norm_topk_prob", True)),
            decoder_sparse_step=int(t.get("decoder_sparse_step", 1)),
            mlp_only_layers=tuple(int(i) for i in (t.get("mlp_only_layers") or ())),
            attention_bias=bool(t.get("attention_bias", False)),
            tie_word_embeddings=bool(thinker.get("tie_word_embeddings", t.get("tie_word_embeddings", False))),
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer`` is a MoE block (else a dense MLP), by transformers' rule."""
        return (
            layer not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer + 1) % self.decoder_sparse_step == 0
        )


@dataclass(frozen=True)
class MultimodalTokens:
    """Placeholder and boundary ids and the position rules of multimodal prompts."""

    image_token_id: int
    video_token_id: int
    audio_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    audio_start_token_id: int
    audio_end_token_id: int
    position_id_per_seconds: float
    spatial_merge_size: int
    audio_n_window: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MultimodalTokens:
        t = thinker_config(config)
        # Defaults: the released Qwen3-Omni-30B-A3B values (its tokenizer's ids).
        return cls(
            image_token_id=int(t.get("image_token_id", 151655)),
            video_token_id=int(t.get("video_token_id", 151656)),
            audio_token_id=int(t.get("audio_token_id", 151675)),
            vision_start_token_id=int(t.get("vision_start_token_id", 151652)),
            vision_end_token_id=int(t.get("vision_end_token_id", 151653)),
            audio_start_token_id=int(t.get("audio_start_token_id", 151669)),
            audio_end_token_id=int(t.get("audio_end_token_id", 151670)),
            position_id_per_seconds=float(t.get("position_id_per_seconds", 13)),
            spatial_merge_size=int((t.get("vision_config") or {}).get("spatial_merge_size", 2)),
            audio_n_window=int((t.get("audio_config") or {}).get("n_window", 50)),
        )


def has_speech(config: Mapping[str, Any]) -> bool:
    """The checkpoint holds a Talker and Code2Wav (the -Instruct release; -Thinking and
    -Captioner say ``enable_audio_output: false``, whatever default sub-configs they list)."""
    return (
        bool(config.get("enable_audio_output", True))
        and isinstance(config.get("talker_config"), dict)
        and isinstance(config.get("code2wav_config"), dict)
    )
