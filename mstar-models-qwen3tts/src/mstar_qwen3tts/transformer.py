"""The Qwen3 decoder layer with QK-norm, used by the talker (paged KV cache through the
engine's attention backend) and the code predictor (a short dense cache per frame).

RoPE tables come in as (cos, ``signed_sin(sin)``) (``mstar.layers.rope.rotate``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from mstar.layers import GatedMLP, RMSNorm, rotate
from mstar.layers.norm import rms_norm
from mstar.layers.packed_linear import linear
from torch import nn

from mstar_qwen3tts.config import TransformerConfig


class QKNormAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)  # per head, before RoPE
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def shard_tensor_parallel(self, tp: Any) -> str:
        """Tensor parallelism (``mstar.parallel``): keep this rank's heads; ``o_proj`` becomes
        row-parallel, which ``_linear`` (core's ``linear``) sums over the ranks."""
        from mstar.parallel.shard import shard_attention_heads

        shard_attention_heads(self, tp)
        return "attention"

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` [..., T, H] → q [..., T, Hq, D], k/v [..., T, Hkv, D] with RoPE applied
        (``sin``: ``signed_sin`` of the sine table)."""
        lead, m = x.shape[:-1], self._modules
        q = _norm(m["q_norm"], _linear(m["q_proj"], x).view(*lead, self.num_heads, self.head_dim))
        k = _norm(m["k_norm"], _linear(m["k_proj"], x).view(*lead, self.num_kv_heads, self.head_dim))
        v = _linear(m["v_proj"], x).view(*lead, self.num_kv_heads, self.head_dim)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def forward_paged(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: Any, layer: int) -> torch.Tensor:
        """Flat tokens [T, H] through the engine's planned paged attention."""
        q, k, v = self.qkv(x, cos, sin)
        return _linear(self._modules["o_proj"], attn.run(layer, q, k, v).reshape(x.shape[0], -1))

    def forward_dense(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Batched [B, T, H] with a dense per-call cache [k, v] of [B, Hkv, S, D]; the new
        tokens follow the cached ones and attend causally."""
        t = x.shape[1]
        if cache is not None and t > 1:
            raise ValueError("a cached dense call takes one new token")
        q, k, v = self.qkv(x, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        # Causal without a cache (one token attending to itself alone is the same either way,
        # and a plain bool keeps the call traceable by torch.compile).
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=cache is None, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return _linear(self._modules["o_proj"], out.transpose(1, 2).reshape(*x.shape[:-1], -1)), [k, v]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = QKNormAttention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward_paged(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: Any, layer: int) -> torch.Tensor:
        m = self._modules
        x = x + m["self_attn"].forward_paged(_norm(m["input_layernorm"], x), cos, sin, attn, layer)
        return x + _mlp(m["mlp"], _norm(m["post_attention_layernorm"], x))

    def forward_dense(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        m = self._modules
        h, cache = m["self_attn"].forward_dense(_norm(m["input_layernorm"], x), cos, sin, cache)
        x = x + h
        return x + _mlp(m["mlp"], _norm(m["post_attention_layernorm"], x)), cache


# The layers' own submodules are computed from their parameters directly, not called: a
# module call and attribute lookup cost a few microseconds each, and the code predictor
# runs ~20 layer passes per frame. (The heads stay module calls, so forward hooks on them,
# as the parity tests' recorders use, still fire.)


def _linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # core's linear: the packed weight where the engine packed the node (CPU), else F.linear.
    p = module._parameters
    return linear(x, p["weight"], p["bias"])  # type: ignore[arg-type]


def _norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return rms_norm(x, module._parameters["weight"], module.eps)  # type: ignore[arg-type]


def _mlp(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    m = module._modules
    return _linear(m["down_proj"], F.silu(_linear(m["gate_proj"], x)) * _linear(m["up_proj"], x))  # type: ignore[arg-type]
