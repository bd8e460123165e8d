"""Self-attention on the engine's paged KV cache, with HF's module names (``q_proj``,
``k_proj``, ``v_proj``, ``o_proj`` and, for Qwen3-style models, ``q_norm``/``k_norm``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mstar.layers.norm import RMSNorm
from mstar.layers.rope import apply_rope


def head_dim_of(config: Mapping[str, Any]) -> int:
    """``head_dim`` when the config gives it, else hidden size / heads (HF's rule)."""
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


class PagedSelfAttention(nn.Module):
    """Grouped-query attention over flat tokens [T, H]; the backend writes this step's K/V
    into the cache and attends each row over its whole cached history.

    ``qk_norm_eps`` adds per-head RMS norms on queries and keys before RoPE (Qwen3).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool = False,
        qk_norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], qk_norm: bool = False) -> PagedSelfAttention:
        """From HF config keys (``attention_bias``; ``rms_norm_eps`` for the q/k norms)."""
        return cls(
            config["hidden_size"],
            config["num_attention_heads"],
            config.get("num_key_value_heads") or config["num_attention_heads"],
            head_dim_of(config),
            bias=bool(config.get("attention_bias", False)),
            qk_norm_eps=config["rms_norm_eps"] if qk_norm else None,
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any, layer: int) -> torch.Tensor:
        """``x`` [T, H], ``cos``/``sin`` [T, 1, D]; ``attention`` is the step's planned
        backend (``engine_inputs.attention``), ``layer`` this layer's cache index."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(attention.run(layer, q, k, v).reshape(t, -1))
