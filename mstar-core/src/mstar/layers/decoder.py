"""The pre-norm decoder layer of Llama-family models (HF names: ``input_layernorm``,
``self_attn``, ``post_attention_layernorm``, ``mlp``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mstar.layers.attention import PagedSelfAttention
from mstar.layers.mlp import GatedMLP
from mstar.layers.norm import RMSNorm


class DecoderLayer(nn.Module):
    """``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: Mapping[str, Any], qk_norm: bool = False) -> None:
        super().__init__()
        h, eps = config["hidden_size"], config["rms_norm_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = PagedSelfAttention.from_config(config, qk_norm=qk_norm)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = GatedMLP.from_config(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, layer)
        return x + self.mlp(self.post_attention_layernorm(x))
