"""The Llama-3.2 decoder stack on M*'s paged KV cache (module names follow HF's
``LlamaForCausalLM`` so checkpoint keys load as they are)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from mstar.layers import RMSNorm, apply_rope
from mstar.layers.rope import RotaryEmbedding
from torch import nn

from mstar_orpheus.config import head_dim


class Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, d, bias = cfg["hidden_size"], head_dim(cfg), bool(cfg.get("attention_bias", False))
        self.n_heads, self.n_kv, self.head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any, layer: int) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.n_kv, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.n_kv, self.head_dim)
        return self.o_proj(attention.run(layer, q, k, v).reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, i, bias = cfg["hidden_size"], cfg["intermediate_size"], bool(cfg.get("mlp_bias", False))
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg.get('hidden_act')!r} (Llama uses silu)")
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and the final norm (checkpoint prefix ``model.``)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.rope = RotaryEmbedding.from_config(cfg, head_dim(cfg))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        """[T] ids of all rows (flat) -> [T, H] hidden states before the final norm."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attention, i)
        return x
