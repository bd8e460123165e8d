"""Code2Wav's pre-transformer: causal sliding-window attention (no QK-norm, GQA), gated MLP,
layer scale on both residual branches. Whole sequences use a banded causal mask; streamed
chunks attend the keys/values carried in the ``StreamState`` (``mstar.layers.streaming``),
at the stream's absolute positions, so a chunk sees exactly the keys the whole decode gives it.
Module names follow ``code2wav.pre_transformer.*``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mstar.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rope
from mstar.layers.codec_blocks import LayerScale
from mstar.layers.streaming import StreamState, stream_positions, window_keys_values
from torch import nn

from mstar_qwen3omni.code2wav_config import Code2WavConfig


class SlidingWindowAttention(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.window = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=bias)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, state: StreamState | None
    ) -> torch.Tensor:
        """``x`` [B, T, C]; ``cos``/``sin`` [B, 1, T, D]; ``positions`` [B, T] absolute."""
        b, t, _ = x.shape
        q = apply_rope(self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if state is None:
            delta = positions[:, :, None] - positions[:, None, :]
            mask = ((delta >= 0) & (delta < self.window))[:, None]
        else:
            k, v, mask = window_keys_values(state, self, k, v, positions, self.window)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SlidingWindowAttention(cfg)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, state: StreamState | None) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, positions, state))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope)

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """[B, T, C] -> [B, T, C]; with ``state``, the next T frames of each stream."""
        b, t, _ = x.shape
        if state is None:
            positions = torch.arange(t, device=x.device).expand(b, t)
        else:
            positions = stream_positions(state, self, t, x.device)
        cos, sin = self.rope(positions.reshape(-1), x.dtype)  # [B*T, 1, D]
        cos, sin = cos.view(b, t, 1, -1).transpose(1, 2), sin.view(b, t, 1, -1).transpose(1, 2)
        for layer in self.layers:
            x = layer(x, cos, sin, positions, state)
        return self.norm(x)
