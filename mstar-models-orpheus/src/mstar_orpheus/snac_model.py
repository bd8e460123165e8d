"""The SNAC decoder (codes -> waveform): residual-VQ lookup plus the convolutional decoder.

Module names mirror the ``hubertsiuzdak/snac_24khz`` checkpoint so its keys load directly
(weight norm is folded into plain weights at load time, ``load_snac_weights``). Only decoding is built: the
encoder and the quantizers' input projections are not needed to turn codes into audio.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mstar.layers.codec_blocks import snake as snake_activation
from mstar.weights import WeightNormFolded, load_weights, torch_file
from torch import nn

SNAC_WEIGHTS = "pytorch_model.bin"

NoiseFn = Callable[[int, int, int], torch.Tensor]
"""(block index, batch, length) -> noise of shape [batch, 1, length]."""


@dataclass(frozen=True)
class SnacConfig:
    sampling_rate: int
    latent_dim: int
    decoder_dim: int
    decoder_rates: tuple[int, ...]
    codebook_size: int
    codebook_dim: int
    vq_strides: tuple[int, ...]
    noise: bool
    depthwise: bool

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SnacConfig:
        if d.get("attn_window_size") is not None:
            raise ValueError("SNAC decoders with local attention (attn_window_size) are not supported; Orpheus uses snac_24khz")
        encoder_rates = d.get("encoder_rates", [3, 3, 7, 7])
        latent = d.get("latent_dim") or d.get("encoder_dim", 64) * 2 ** len(encoder_rates)
        return cls(
            sampling_rate=int(d.get("sampling_rate", 44100)),
            latent_dim=int(latent),
            decoder_dim=int(d.get("decoder_dim", 1536)),
            decoder_rates=tuple(d.get("decoder_rates", (7, 7, 3, 3))),
            codebook_size=int(d.get("codebook_size", 4096)),
            codebook_dim=int(d.get("codebook_dim", 8)),
            vq_strides=tuple(d.get("vq_strides", (8, 4, 2, 1))),
            noise=bool(d.get("noise", True)),
            depthwise=bool(d.get("depthwise", True)),
        )

    @property
    def hop_length(self) -> int:
        return math.prod(self.decoder_rates)


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return snake_activation(x, alpha, (alpha + 1e-9).reciprocal())


class Snake1d(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.alpha)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int, kernel: int = 7) -> None:
        super().__init__()
        pad = (kernel - 1) * dilation // 2
        self.block = nn.Sequential(
            Snake1d(dim),
            nn.Conv1d(dim, dim, kernel, dilation=dilation, padding=pad, groups=groups),
            Snake1d(dim),
            nn.Conv1d(dim, dim, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        crop = (x.shape[-1] - y.shape[-1]) // 2
        if crop > 0:
            x = x[..., crop:-crop]
        return x + y


class NoiseBlock(nn.Module):
    """Adds ``noise * linear(x)``; the noise comes from the caller (seeded, reproducible)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return x + noise * self.linear(x)


class DecoderBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, stride: int, noise: bool, groups: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            Snake1d(in_dim),
            nn.ConvTranspose1d(
                in_dim, out_dim, 2 * stride, stride=stride, padding=math.ceil(stride / 2), output_padding=stride % 2
            ),
        ]
        if noise:
            layers.append(NoiseBlock(out_dim))
        layers += [ResidualUnit(out_dim, d, groups) for d in (1, 3, 9)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, noise: Callable[[int, int], torch.Tensor] | None) -> torch.Tensor:
        for layer in self.block:
            if isinstance(layer, NoiseBlock):
                x = layer(x, noise(x.shape[0], x.shape[-1]) if noise else torch.zeros_like(x[:, :1]))
            else:
                x = layer(x)
        return x


class Decoder(nn.Module):
    def __init__(self, cfg: SnacConfig) -> None:
        super().__init__()
        latent, channels = cfg.latent_dim, cfg.decoder_dim
        if cfg.depthwise:
            layers: list[nn.Module] = [
                nn.Conv1d(latent, latent, 7, padding=3, groups=latent),
                nn.Conv1d(latent, channels, 1),
            ]
        else:
            layers = [nn.Conv1d(latent, channels, 7, padding=3)]
        out_dim = channels
        for i, stride in enumerate(cfg.decoder_rates):
            in_dim, out_dim = channels // 2**i, channels // 2 ** (i + 1)
            layers.append(DecoderBlock(in_dim, out_dim, stride, cfg.noise, groups=out_dim if cfg.depthwise else 1))
        layers += [Snake1d(out_dim), nn.Conv1d(out_dim, 1, 7, padding=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor, noise: NoiseFn | None) -> torch.Tensor:
        block = 0
        for layer in self.model:
            if isinstance(layer, DecoderBlock):
                fn = (lambda b, t, i=block: noise(i, b, t)) if noise else None
                z = layer(z, fn)
                block += 1
            else:
                z = layer(z)
        return z


class Quantizer(nn.Module):
    """Codebook lookup and output projection of one residual-VQ level."""

    def __init__(self, cfg: SnacConfig, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)
        self.out_proj = nn.Conv1d(cfg.codebook_dim, cfg.latent_dim, 1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.out_proj(self.codebook(codes).transpose(1, 2))
        return z.repeat_interleave(self.stride, dim=-1)


class ResidualQuantizer(nn.Module):
    def __init__(self, cfg: SnacConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(Quantizer(cfg, s) for s in cfg.vq_strides)

    def forward(self, codes: list[torch.Tensor]) -> torch.Tensor:
        z = self.quantizers[0](codes[0])
        for q, c in zip(self.quantizers[1:], codes[1:], strict=True):
            z = z + q(c)
        return z


class SnacDecoder(nn.Module):
    """codes (one [B, n_level] tensor per level) -> audio [B, 1, samples] in [-1, 1]."""

    # Checkpoint keys present in a full SNAC checkpoint that decoding does not use.
    UNUSED_KEYS = r"^encoder\.|^quantizer\.quantizers\.\d+\.in_proj\."

    def __init__(self, cfg: SnacConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = ResidualQuantizer(cfg)
        self.decoder = Decoder(cfg)

    def forward(self, codes: list[torch.Tensor], noise: NoiseFn | None = None) -> torch.Tensor:
        return self.decoder(self.quantizer(codes), noise)


def load_snac_weights(decoder: SnacDecoder, snac_dir: Path) -> None:
    """``snac_dir/pytorch_model.bin`` through core's strict loader: memory-mapped, each
    weight-norm pair read as its plain weight, the encoder's keys ignored."""
    source = WeightNormFolded(torch_file(Path(snac_dir) / SNAC_WEIGHTS))
    load_weights(decoder, source, ignore=(SnacDecoder.UNUSED_KEYS,))
