"""Code2Wav's sizes from the checkpoint's ``code2wav_config`` (every size read, none assumed)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mstar.layers import rope_parameters


@dataclass(frozen=True)
class Code2WavConfig:
    codebook_size: int
    num_quantizers: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int
    rms_norm_eps: float
    rope: dict[str, Any]
    attention_bias: bool
    upsampling_ratios: tuple[int, ...]  # transposed convs + ConvNeXt after the transformer
    upsample_rates: tuple[int, ...]  # the decoder blocks' strides
    decoder_dim: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Code2WavConfig:
        """From the whole checkpoint config (``config["code2wav_config"]``)."""
        c = config.get("code2wav_config")
        if not isinstance(c, dict):
            raise ValueError("the checkpoint config has no code2wav_config (a Thinker-only checkpoint cannot speak)")
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported code2wav hidden_act {c.get('hidden_act')!r} (Code2Wav uses silu)")
        heads = int(c["num_attention_heads"])
        rates = tuple(int(r) for r in c.get("upsample_rates", (8, 5, 4, 3)))
        decoder_dim = int(c.get("decoder_dim", 1536))
        if decoder_dim % 2 ** len(rates):
            raise ValueError(f"decoder_dim {decoder_dim} must be divisible by 2**{len(rates)} (it halves per block)")
        return cls(
            codebook_size=int(c["codebook_size"]),
            num_quantizers=int(c["num_quantizers"]),
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
            sliding_window=int(c.get("sliding_window", 72)),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
            rope=rope_parameters(c),
            attention_bias=bool(c.get("attention_bias", False)),
            upsampling_ratios=tuple(int(r) for r in c.get("upsampling_ratios", (2, 2))),
            upsample_rates=rates,
            decoder_dim=decoder_dim,
        )

    @property
    def samples_per_frame(self) -> int:
        """Output samples per code frame (1920 for the released 12.5 Hz codec at 24 kHz)."""
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)
