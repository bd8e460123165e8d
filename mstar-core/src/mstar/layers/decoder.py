"""The pre-norm decoder of Llama-family models with HF's names: ``DecoderLayer``
(``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``) and
``DecoderModel`` (``embed_tokens``, ``layers``, ``norm``: the checkpoint's ``model.``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mstar.layers.attention import PagedSelfAttention, head_dim_of
from mstar.layers.mlp import GatedMLP
from mstar.layers.norm import RMSNorm
from mstar.layers.rope import RotaryEmbedding


class DecoderLayer(nn.Module):
    """``x + attn(norm(x))``, then ``x + mlp(norm(x))``, built from HF config keys.

    ``qk_norm`` (Qwen3), ``qkv_bias``/``o_bias`` (None: the config's ``attention_bias``;
    Qwen2: ``qkv_bias=True, o_bias=False``), ``fused_qkv``/``fused_gate_up`` (Phi-3's
    ``qkv_proj``/``gate_up_proj``): see ``PagedSelfAttention`` and ``GatedMLP``.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        qk_norm: bool = False,
        *,
        qkv_bias: bool | None = None,
        o_bias: bool | None = None,
        fused_qkv: bool = False,
        fused_gate_up: bool = False,
        layer: int | None = None,
    ) -> None:
        super().__init__()
        h, eps = config["hidden_size"], config["rms_norm_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = PagedSelfAttention.from_config(
            config, qk_norm, qkv_bias=qkv_bias, o_bias=o_bias, fused_qkv=fused_qkv, layer=layer
        )
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = GatedMLP.from_config(config, fused_gate_up=fused_gate_up)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any, layer: int) -> torch.Tensor:
        """``x`` [T, H] -> [T, H]; ``cos``/``sin`` [T, 1, R] from ``RotaryEmbedding``."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """Embeddings, ``num_hidden_layers`` ``DecoderLayer`` s and the final norm, with the
    rotary embedding the config names (``rope_parameters``/``rope_scaling``, partial
    rotary). ``layer_options`` go to every ``DecoderLayer``."""

    def __init__(self, config: Mapping[str, Any], **layer_options: Any) -> None:
        super().__init__()
        h = config["hidden_size"]
        self.embed_tokens = nn.Embedding(config["vocab_size"], h)
        self.layers = nn.ModuleList(DecoderLayer(config, **layer_options, layer=i) for i in range(config["num_hidden_layers"]))
        self.norm = RMSNorm(h, config["rms_norm_eps"])
        self.rope = RotaryEmbedding.from_config(config, head_dim_of(config))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        """Flat ids [T] of every row and their absolute positions [T] -> hidden states
        [T, H] *before* the final norm (apply ``norm`` to the rows you need logits of)."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attention, i)
        return x
