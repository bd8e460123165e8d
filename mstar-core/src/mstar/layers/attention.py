"""Self-attention on the engine's paged KV cache, with HF's module names: ``q_proj``,
``k_proj``, ``v_proj`` or one fused ``qkv_proj`` (Phi-3), ``o_proj``, and for Qwen3-style
models ``q_norm``/``k_norm``."""

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


def sliding_window_of(config: Mapping[str, Any], layer: int) -> int | None:
    """The attention window of decoder layer ``layer`` as transformers reads it, or None
    (full attention): ``layer_types[layer] == "sliding_attention"`` when the config lists
    layer types; else none when ``use_sliding_window`` is false (Qwen2/Qwen3), from
    ``max_window_layers`` on when it is true; else ``sliding_window`` (Mistral, Phi-3)."""
    window = config.get("sliding_window")
    if config.get("layer_types"):
        return window if config["layer_types"][layer] == "sliding_attention" else None
    if "use_sliding_window" in config:
        if not config["use_sliding_window"]:
            return None
        return window if layer >= int(config.get("max_window_layers", 0)) else None
    return window


def full_attention_limit(config: Mapping[str, Any]) -> int | None:
    """The longest sequence that every layer attends as full causal attention: the smallest
    sliding window, or None without one. transformers' window lets a query see the
    ``sliding_window`` keys ending at itself, so a sequence of at most that many tokens is
    unaffected; the attention backends attend whole rows, so a node serves up to this."""
    windows = [w for i in range(int(config["num_hidden_layers"])) if (w := sliding_window_of(config, i))]
    return min(windows) if windows else None


class PagedSelfAttention(nn.Module):
    """Grouped-query attention over flat tokens [T, H]; the backend writes this step's K/V
    into the cache and attends each row over its whole cached history.

    ``bias``: biases on q/k/v; ``o_bias`` on ``o_proj`` (defaults to ``bias``; Qwen2 has
    q/k/v biases and none on ``o_proj``). ``fused_qkv``: one ``qkv_proj`` whose output is
    q, k, v side by side (Phi-3's checkpoints). ``qk_norm_eps`` adds per-head RMS norms on
    queries and keys before RoPE (Qwen3). RoPE covers the first ``cos.shape[-1]`` dims of
    each head (partial rotary).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool = False,
        qk_norm_eps: float | None = None,
        *,
        o_bias: bool | None = None,
        fused_qkv: bool = False,
        window: int | None = None,
    ) -> None:
        super().__init__()
        self.window = window  # a sliding-window layer's keys per query (None: all)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        if fused_qkv:
            self.qkv_proj = nn.Linear(hidden_size, sum(self.sizes), bias=bias)
        else:
            self.q_proj = nn.Linear(hidden_size, self.sizes[0], bias=bias)
            self.k_proj = nn.Linear(hidden_size, self.sizes[1], bias=bias)
            self.v_proj = nn.Linear(hidden_size, self.sizes[2], bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias if o_bias is None else o_bias)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        qk_norm: bool = False,
        *,
        qkv_bias: bool | None = None,
        o_bias: bool | None = None,
        fused_qkv: bool = False,
        layer: int | None = None,
    ) -> PagedSelfAttention:
        """From HF config keys: sizes, ``attention_bias`` (q/k/v and o unless
        ``qkv_bias``/``o_bias`` say otherwise), ``rms_norm_eps`` for the q/k norms; with the
        decoder ``layer`` index, its sliding window (``sliding_window_of``)."""
        bias = bool(config.get("attention_bias", False))
        return cls(
            config["hidden_size"],
            config["num_attention_heads"],
            config.get("num_key_value_heads") or config["num_attention_heads"],
            head_dim_of(config),
            bias=bias if qkv_bias is None else qkv_bias,
            qk_norm_eps=config["rms_norm_eps"] if qk_norm else None,
            o_bias=bias if o_bias is None else o_bias,
            fused_qkv=fused_qkv,
            window=None if layer is None else sliding_window_of(config, layer),
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any, layer: int) -> torch.Tensor:
        """``x`` [T, H], ``cos``/``sin`` [T, 1, R] (R <= head_dim rotated dims); ``attention``
        is the step's planned backend (``engine_inputs.attention``), ``layer`` this layer's
        cache index. Returns [T, H]."""
        t = x.shape[0]
        if "qkv_proj" in self._modules:
            q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention.run(layer, q, k, v) if self.window is None else attention.run(layer, q, k, v, window=self.window)
        return self.o_proj(out.reshape(t, -1))
