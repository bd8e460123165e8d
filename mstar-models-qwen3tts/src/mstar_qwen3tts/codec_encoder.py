"""The 12 Hz speech tokenizer's encoder (audio → codes), for in-context voice cloning.

A Mimi-style encoder (``encoder_config`` of ``speech_tokenizer/config.json``, weights
``encoder.*`` of ``speech_tokenizer/model.safetensors``): a causal SEANet convolution stack
(24 kHz → 25 Hz), a causal transformer, a stride-2 convolution (→ 12.5 Hz),
then a split residual VQ (semantic + acoustic codebooks) of which the first
``encoder_valid_num_quantizers`` codebooks are kept. Runs once per reference clip, as the
engine node ``codec_encoder`` (``mstar_qwen3tts.encoder_nodes``) or, making a saved voice,
in the preprocess pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from mstar.layers import apply_rope
from mstar.layers.codec_blocks import LayerScale
from torch import nn


@dataclass(frozen=True)
class EncoderConfig:
    """``encoder_config`` keys (defaults as the config class that reads them)."""

    sampling_rate: int = 24000
    frame_rate: float = 12.5
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    vector_quantization_hidden_dimension: int = 256
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 250
    attention_bias: bool = False
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    use_conv_shortcut: bool = False
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EncoderConfig:
        known = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in cls.__dataclass_fields__ and v is not None}
        cfg = cls(**known)
        where = "speech_tokenizer/config.json: encoder_config"
        if not cfg.use_causal_conv or cfg.pad_mode != "constant" or cfg.use_conv_shortcut or cfg.hidden_act != "gelu":
            raise ValueError(f"{where}: only causal, zero-padded convolutions without conv shortcuts and gelu are supported")
        if cfg.audio_channels != 1:
            raise ValueError(f"{where}: audio_channels must be 1")
        return cfg

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def encodec_frame_rate(self) -> int:
        return math.ceil(self.sampling_rate / math.prod(self.upsampling_ratios))

    def output_frames(self, samples: int, downsample_rate: int) -> int:
        """The frames ``CodecEncoder.encode`` gives for a clip of ``samples``: each causal
        convolution of stride s gives ceil(n / s) frames for n, and the output is cut at one
        frame per ``downsample_rate`` samples."""
        stride = math.prod(self.upsampling_ratios) * 2  # the SEANet strides, then the stride-2 downsample
        return min(-(-samples // stride), -(-samples // downsample_rate))


class CausalConv(nn.Module):
    """Conv1d padded on the left by ``kernel - stride`` and on the right just enough to
    complete the last frame (``pad_mode``: zeros or replicate)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.effective_kernel = (kernel - 1) * dilation + 1
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length, k, s = x.shape[-1], self.effective_kernel, self.stride
        pad = k - s
        frames = math.ceil((length - k + pad) / s + 1) - 1
        extra = frames * s + k - pad - length
        return self.conv(nn.functional.pad(x, (pad, extra), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    def __init__(self, cfg: EncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        # Indices as in the checkpoint: ELU, conv, ELU, conv.
        self.block = nn.ModuleList([nn.ELU(), CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation),
                                    nn.ELU(), CausalConv(hidden, dim, 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class SEANetEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(cfg.audio_channels, cfg.num_filters, cfg.kernel_size)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            ch = scale * cfg.num_filters
            layers += [ResnetBlock(cfg, ch, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), CausalConv(ch, ch * 2, ratio * 2, stride=ratio)]
            scale *= 2
        layers += [nn.ELU(), CausalConv(scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Attention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd, bias = cfg.dim_per_head, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd, heads, kv = self.cfg.dim_per_head, self.cfg.num_attention_heads, self.cfg.num_key_value_heads
        q = self.q_proj(x).view(b, t, heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, kv, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, kv, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        scores = (q @ k.transpose(2, 3)) / math.sqrt(hd) + mask
        out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, heads * hd))


class MLP(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    """Causal over the whole clip. The config's ``sliding_window`` (250 frames, 10 s, in the
    released tokenizer) is not applied: the reference (qwen-tts 0.1.1 on transformers 4.57)
    builds a plain causal mask for this transformer, and parity follows it; clips up to the
    window's length see no difference."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, hd = x.shape[1], self.cfg.dim_per_head
        pos = torch.arange(t, device=x.device, dtype=torch.float32)
        inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
        angles = torch.cat([pos[:, None] * inv[None]] * 2, dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        future = torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1)
        mask = torch.zeros(t, t, device=x.device, dtype=x.dtype).masked_fill(future, torch.finfo(x.dtype).min)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return x


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """[N, D] → index of the nearest centroid (Euclidean) per row."""
        embed = self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
        return torch.cdist(x[None].float(), embed[None].float(), p=2)[0].argmin(dim=-1)

    def lookup(self, idx: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(idx, self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None])


class VQLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.codebook = Codebook(cfg.codebook_size, cfg.codebook_dim)


class RVQ(nn.Module):
    def __init__(self, cfg: EncoderConfig, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VQLayer(cfg) for _ in range(n))
        dim = cfg.vector_quantization_hidden_dimension
        if dim != cfg.hidden_size:
            self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False)
            self.output_proj = nn.Conv1d(dim, cfg.hidden_size, 1, bias=False)  # decode only; kept for the weights
        else:
            self.input_proj = None

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """[B, hidden, T] → codes [n, B, T]: each layer quantizes what the ones before left."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        residual = x.transpose(1, 2)  # [B, T, D]
        out = []
        for layer in self.layers[:n]:
            idx = layer.codebook.nearest(residual.reshape(-1, residual.shape[-1])).view(residual.shape[:-1])
            residual = residual - layer.codebook.lookup(idx)
            out.append(idx)
        return torch.stack(out)


class SplitRVQ(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = RVQ(cfg, cfg.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = RVQ(cfg, cfg.num_quantizers - cfg.num_semantic_quantizers)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` codebooks [B, n, T]: semantic ones, then acoustic ones (both from ``x``)."""
        codes = self.semantic_residual_vector_quantizer.encode(x, min(n, self.semantic))
        if n > self.semantic:
            codes = torch.cat([codes, self.acoustic_residual_vector_quantizer.encode(x, n - self.semantic)])
        return codes.transpose(0, 1)


class CodecEncoder(nn.Module):
    """Keys as the checkpoint's ``encoder.*`` (the prefix stripped)."""

    def __init__(self, cfg: EncoderConfig, num_quantizers: int, downsample_rate: int) -> None:
        super().__init__()
        if not cfg.num_semantic_quantizers <= num_quantizers <= cfg.num_quantizers:
            raise ValueError(f"encoder_valid_num_quantizers {num_quantizers} is outside "
                             f"[{cfg.num_semantic_quantizers}, {cfg.num_quantizers}]")
        self.cfg = cfg
        self.num_quantizers = num_quantizers
        self.downsample_rate = downsample_rate
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = Transformer(cfg)
        self.downsample = CausalConv(cfg.hidden_size, cfg.hidden_size, 2 * int(cfg.encodec_frame_rate / cfg.frame_rate),
                                     stride=2, bias=False, pad_mode="replicate")
        self.quantizer = SplitRVQ(cfg)

    @torch.inference_mode()
    def encode(self, wave: torch.Tensor) -> torch.Tensor:
        """[samples] float32 at ``cfg.sampling_rate`` → codes [frames, num_quantizers] (int64),
        one frame per ``downsample_rate`` samples (the last one partial)."""
        return self.encode_batch(wave[None])[0]

    @torch.inference_mode()
    def encode_batch(self, waves: torch.Tensor) -> torch.Tensor:
        """[B, samples] (clips of one length) → codes [B, frames, num_quantizers]."""
        device = self.downsample.conv.weight.device
        x = self.encoder(waves.to(device=device, dtype=torch.float32)[:, None])
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        codes = self.quantizer.encode(self.downsample(x), self.num_quantizers)  # [B, n, T]
        frames = -(-waves.shape[-1] // self.downsample_rate)
        return codes[:, :, :frames].transpose(1, 2).contiguous()
