"""Building blocks of convolutional audio decoders (vocoders), streaming-ready: each takes an
optional ``StreamState`` so a chunk carries its convolution history (``mstar.layers.streaming``).

Parameter names follow the released checkpoints that use them (``scale``, ``alpha``/``beta``,
``dwconv``/``pwconv1``/``pwconv2``/``gamma``, ``act1``/``conv1``/``act2``/``conv2``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.layers.streaming import CausalConv1d, StreamState


def snake(x: torch.Tensor, freq: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """``x + inv_scale * sin(x * freq)**2`` (``freq``, ``inv_scale`` broadcast per channel), the
    Snake activations of BigVGAN-style vocoders. Without autograd the sine, its square and
    both products are computed in place on one temporary: the same bits (``t * t`` is what
    ``pow(2)`` computes; the products commute exactly), in 1.2-3.4x less time on a codec's
    long [B, C, T] activations (one allocation instead of four; 2-core host)."""
    if torch.is_grad_enabled() and (x.requires_grad or freq.requires_grad or inv_scale.requires_grad):
        return x + inv_scale * torch.sin(x * freq).pow(2)
    t = x * freq
    t.sin_()
    t.mul_(t)
    return t.mul_(inv_scale).add_(x)


class LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch (``scale``, starting at ``init``)."""

    def __init__(self, dim: int, init: float = 1.0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class SnakeBeta(nn.Module):
    """x + sin²(x·e^α) / (e^β + 1e-9), per channel (α, β in log scale); pointwise, so a
    stream carries nothing."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        beta = self.beta.exp()[None, :, None]
        return snake(x, self.alpha.exp()[None, :, None], 1.0 / (beta + 1e-9))


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv (kernel 7), LayerNorm, pointwise MLP (GELU), layer scale ``gamma``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        h = self.norm(self.dwconv(x, state).transpose(1, 2))
        h = self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    """Snake, causal conv (kernel 7, ``dilation``), Snake, 1x1 conv, plus the input."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), state)), state)
