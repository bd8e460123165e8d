"""The Talker's and its code predictor's sizes and special ids, read from the checkpoint's
``talker_config`` (with ``text_config`` and ``code_predictor_config``) and the top-level
``tts_*`` / chat-role ids. Nothing is assumed that the checkpoint states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mstar.layers import rope_parameters

from mstar_qwen3omni.config import MultimodalTokens


def _talker(config: dict[str, Any]) -> dict[str, Any]:
    t = config.get("talker_config")
    if not isinstance(t, dict) or not isinstance(t.get("text_config"), dict):
        raise ValueError("the checkpoint config has no talker_config.text_config (a Thinker-only checkpoint cannot speak)")
    return t


def _mrope(text: dict[str, Any]) -> tuple[float, tuple[int, int, int]]:
    params = rope_parameters(text)
    if params["rope_type"] != "default":
        raise ValueError(f"unsupported talker rope_type {params['rope_type']!r} (M-RoPE uses 'default')")
    if params.get("mrope_interleaved", params.get("interleaved", True)) is False:
        raise ValueError("only the interleaved M-RoPE layout is supported (mrope_interleaved=false)")
    section = tuple(int(s) for s in params.get("mrope_section", (24, 20, 20)))  # transformers' default
    if len(section) != 3:
        raise ValueError(f"talker mrope_section must have 3 entries, got {list(section)}")
    return float(params["rope_theta"]), section  # type: ignore[return-value]


@dataclass(frozen=True)
class CodePredictorConfig:
    """``talker_config.code_predictor_config``; ``layer`` is the mapping ``mstar.layers``
    builds its decoder layers from (HF key names)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_code_groups: int
    rms_norm_eps: float
    head_dim: int
    rope: dict[str, Any]
    layer: dict[str, Any]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CodePredictorConfig:
        c = dict(_talker(config)["code_predictor_config"])
        if c.get("sliding_window") is not None and any(t != "full_attention" for t in c.get("layer_types") or ()):
            raise ValueError("sliding-window layers in the code predictor are not supported (the released one has none)")
        heads = int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        layer = {
            "hidden_size": int(c["hidden_size"]),
            "intermediate_size": int(c["intermediate_size"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(c.get("num_key_value_heads") or heads),
            "head_dim": head_dim,
            "rms_norm_eps": float(c.get("rms_norm_eps", 1e-6)),
            "attention_bias": bool(c.get("attention_bias", False)),
            "hidden_act": c.get("hidden_act", "silu"),
        }
        return cls(
            vocab_size=int(c["vocab_size"]),
            hidden_size=layer["hidden_size"],
            num_layers=int(c["num_hidden_layers"]),
            num_code_groups=int(c.get("num_code_groups", 32)),
            rms_norm_eps=layer["rms_norm_eps"],
            head_dim=head_dim,
            rope=rope_parameters(c),
            layer=layer,
        )


@dataclass(frozen=True)
class TalkerConfig:
    """The Talker LM (``talker_config.text_config``), its projections from the Thinker and
    the codec / TTS special ids."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the text/hidden projections' inner width
    hidden_act: str
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
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    attention_bias: bool
    thinker_hidden_size: int
    accept_hidden_layer: int
    num_code_groups: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    speakers: dict[str, int]  # lower-case name -> codec id, as the checkpoint lists them
    tts_bos_id: int  # Thinker-vocabulary ids whose projected embeddings frame the spoken text
    tts_eos_id: int
    tts_pad_id: int
    im_start_id: int
    user_id: int
    assistant_id: int
    predictor: CodePredictorConfig

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TalkerConfig:
        t = _talker(config)
        x = t["text_config"]
        if x.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported talker hidden_act {x.get('hidden_act')!r} (the Talker uses silu)")
        theta, section = _mrope(x)
        heads = int(x["num_attention_heads"])
        head_dim = int(x.get("head_dim") or int(x["hidden_size"]) // heads)
        predictor = CodePredictorConfig.from_config(config)
        groups = int(t.get("num_code_groups", 32))
        if predictor.num_code_groups != groups:
            raise ValueError(f"talker num_code_groups {groups} != code predictor's {predictor.num_code_groups}")
        if predictor.hidden_size != int(x["hidden_size"]):
            raise ValueError("the code predictor's hidden_size must equal the talker's (it reads the talker state as is)")
        return cls(
            vocab_size=int(x["vocab_size"]),
            hidden_size=int(x["hidden_size"]),
            intermediate_size=int(x["intermediate_size"]),
            hidden_act=str(x.get("hidden_act", "silu")),
            num_layers=int(x["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(x.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(x.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            mrope_section=section,
            max_position_embeddings=int(x.get("max_position_embeddings", 32768)),
            num_experts=int(x.get("num_experts", x.get("num_local_experts", 0))),
            num_experts_per_tok=int(x["num_experts_per_tok"]),
            moe_intermediate_size=int(x["moe_intermediate_size"]),
            shared_expert_intermediate_size=int(x["shared_expert_intermediate_size"]),
            norm_topk_prob=bool(x.get("norm_topk_prob", False)),
            attention_bias=bool(x.get("attention_bias", False)),
            thinker_hidden_size=int(t["thinker_hidden_size"]),
            accept_hidden_layer=int(t["accept_hidden_layer"]),
            num_code_groups=groups,
            codec_pad_id=int(t["codec_pad_id"]),
            codec_bos_id=int(t["codec_bos_id"]),
            codec_eos_id=int(t["codec_eos_token_id"]),
            codec_nothink_id=int(t["codec_nothink_id"]),
            codec_think_bos_id=int(t["codec_think_bos_id"]),
            codec_think_eos_id=int(t["codec_think_eos_id"]),
            speakers={str(k).lower(): int(v) for k, v in (t.get("speaker_id") or {}).items()},
            tts_bos_id=int(config.get("tts_bos_token_id", 151672)),
            tts_eos_id=int(config.get("tts_eos_token_id", 151673)),
            tts_pad_id=int(config.get("tts_pad_token_id", 151671)),
            im_start_id=int(config.get("im_start_token_id", 151644)),
            user_id=int(config.get("user_token_id", 872)),
            assistant_id=int(config.get("assistant_token_id", 77091)),
            predictor=predictor,
        )

    def speaker_id(self, voice: str) -> int:
        """The codec id of ``voice`` (case-insensitive); ValueError listing the voices otherwise."""
        sid = self.speakers.get(voice.lower())
        if sid is None:
            raise ValueError(f"unknown voice {voice!r}; this checkpoint has {sorted(self.speakers)}")
        return sid

    def suppressed_ids(self) -> list[int]:
        """Ids the talker must never sample: the top 1024 of its vocabulary (codec specials) except EOS."""
        return [i for i in range(max(0, self.vocab_size - 1024), self.vocab_size) if i != self.codec_eos_id]


def talker_multimodal_tokens(config: dict[str, Any]) -> MultimodalTokens:
    """The placeholder ids and position rules transformers' Talker reads for its M-RoPE
    positions (``talker_config``'s own values, which may differ from the Thinker's)."""
    thinker = MultimodalTokens.from_config(config)
    t = _talker(config)
    return MultimodalTokens(
        image_token_id=int(t.get("image_token_id", thinker.image_token_id)),
        video_token_id=int(t.get("video_token_id", thinker.video_token_id)),
        audio_token_id=int(t.get("audio_token_id", thinker.audio_token_id)),
        vision_start_token_id=int(t.get("vision_start_token_id", thinker.vision_start_token_id)),
        vision_end_token_id=thinker.vision_end_token_id,
        audio_start_token_id=int(t.get("audio_start_token_id", thinker.audio_start_token_id)),
        audio_end_token_id=thinker.audio_end_token_id,
        position_id_per_seconds=float(t.get("position_id_per_seconds", thinker.position_id_per_seconds)),
        spatial_merge_size=int(t.get("spatial_merge_size", thinker.spatial_merge_size)),
        audio_n_window=thinker.audio_n_window,
    )
