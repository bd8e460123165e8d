"""The 12 Hz speech-tokenizer decoder: codes [B, G, T] → waveform [B, 1, T * samples_per_frame].

Residual-VQ lookup, a causal convolution, a sliding-window causal transformer, then
transposed-convolution upsampling with ConvNeXt and Snake residual blocks. Everything is
causal: passing a ``StreamState`` decodes a stream chunk by chunk, each chunk costing the
same, and the chunks join to the whole decode (``mstar.layers.streaming``).
Module names follow the checkpoint's ``decoder.*`` keys.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from mstar.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rope
from mstar.layers.codec_blocks import ConvNeXtBlock, LayerScale, ResidualUnit, SnakeBeta
from mstar.layers.streaming import CausalConv1d as CausalConv
from mstar.layers.streaming import CausalConvTranspose1d as CausalUpsample
from mstar.layers.streaming import StreamState, stream_positions, window_keys_values
from torch import nn

from mstar_qwen3tts.config import CodecConfig


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalUpsample(cin, cout, 2 * rate, rate), *(ResidualUnit(cout, d) for d in (1, 3, 9))]
        )

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, state)
        return x


# ---- residual vector quantizer (decode side) -----------------------------------------------


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def vectors(self) -> torch.Tensor:
        if torch.compiler.is_compiling():  # one fused kernel there; the cache key is not traceable
            return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
        # Cached: a streamed chunk would otherwise pay for the whole table every time.
        key = (self.embedding_sum._version, self.cluster_usage._version, self.embedding_sum.data_ptr(),
               self.cluster_usage.data_ptr(), self.embedding_sum.device)
        if getattr(self, "_vectors_key", None) != key:
            self._vectors = self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
            self._vectors_key = key
        return self._vectors


class VQLayer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(size, dim)


class VQStack(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VQLayer(size, dim) for _ in range(n))


class RVQ(nn.Module):
    def __init__(self, n: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.vq = VQStack(n, size, dim)
        # The encoder-side projection is part of the checkpoint; decoding never uses it.
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, n, T] → [B, io_dim, T]."""
        total = sum(
            F.embedding(codes[:, i], layer._codebook.vectors()) for i, layer in enumerate(self.vq.layers)
        )
        return self.output_proj(total.transpose(1, 2))  # type: ignore[union-attr]


class SplitRVQ(nn.Module):
    """The first (semantic) codebook and the acoustic rest, each with its own projections."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = RVQ(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = RVQ(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


# ---- the sliding-window transformer ----------------------------------------------------------


class StreamWindow(NamedTuple):
    """What a streamed chunk's attention layers share: the state and the frames' positions."""

    state: StreamState
    positions: torch.Tensor  # [B, T]
    window: int


class WindowAttention(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, stream: StreamWindow | None = None
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self.q_proj(x).view(b, t, self.num_heads, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rope(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if stream is not None:  # prepend the carried keys of the last window - 1 frames
            k, v, mask = window_keys_values(stream.state, self, k, v, stream.positions, stream.window)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.self_attn = WindowAttention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, 0.01)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, 0.01)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, stream: StreamWindow | None = None
    ) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, stream))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg.head_dim, {"rope_theta": cfg.rope_theta})
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """[B, T, latent] → [B, T, latent]; query t attends keys (t - window, t]."""
        x = self.input_proj(x)
        t = x.shape[1]
        if state is None:
            pos = torch.arange(t, device=x.device)
            cos, sin = self.rope(pos, x.dtype)
            delta = pos[:, None] - pos[None, :]
            mask = (delta >= 0) & (delta < self.cfg.sliding_window)
            stream = None
        else:
            # Absolute positions per stream; masks come from each layer's carried window.
            positions = stream_positions(state, self, t, x.device)
            cos, sin = self.rope.cos_sin(positions, x.dtype)
            cos, sin = cos[:, :, None, :], sin[:, :, None, :]
            mask = torch.ones((), dtype=torch.bool, device=x.device)
            stream = StreamWindow(state, positions, self.cfg.sliding_window)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, stream)
        return self.output_proj(self.norm(x))


class CodecDecoder(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitRVQ(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalUpsample(cfg.latent_dim, cfg.latent_dim, f, f), ConvNeXtBlock(cfg.latent_dim)])
            for f in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [
                CausalConv(cfg.latent_dim, cfg.decoder_dim, 7),
                *(DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)),
                SnakeBeta(dims[-1]),
                CausalConv(dims[-1], 1, 7),
            ]
        )

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.cfg.upsample_rates) * math.prod(self.cfg.upsampling_ratios)

    def forward(self, codes: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """codes [B, G, T] (long) → waveform [B, 1, T * samples_per_frame] in [-1, 1].

        With ``state`` the codes continue the stream(s) ``state`` carries (and ``state``
        advances); without, they are a whole utterance."""
        if codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"expected {self.cfg.num_quantizers} codebook groups, got {codes.shape[1]}")
        x = self.pre_conv(self.quantizer.decode(codes), state)
        x = self.pre_transformer(x.transpose(1, 2), state).transpose(1, 2)
        for up, block in self.upsample:  # type: ignore[misc]
            x = block(up(x, state), state)
        for layer in self.decoder:
            x = layer(x, state)
        return x.clamp(-1.0, 1.0)
