"""Code2Wav's convolutional layers, each usable whole (``state=None``) or streamed with a
``mstar.layers.streaming.StreamState``. Module names follow the checkpoint's ``code2wav.*`` keys.

The decoder blocks' transposed convolutions trim ``kernel - stride`` samples on *both*
sides (transformers' ``Qwen3OmniMoeCausalTransConvNet``). Trimming the right overhang is
the causal transposed convolution of ``mstar.layers.streaming``; trimming the left is a
one-off delay: a stream's first ``kernel - stride`` outputs are dropped, later outputs are
exactly the causal layer's. So a stream carries the causal layer's overlap tail plus
whether it has started, and a first chunk yields ``kernel - stride`` fewer samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mstar.layers.streaming import CausalConv1d, CausalConvTranspose1d, StreamState
from torch import nn


class SnakeBeta(nn.Module):
    """x + sin²(x·e^α) / (e^β + 1e-9), per channel; pointwise, so nothing is carried."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


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


class TwoSidedTrimUpsample(CausalConvTranspose1d):
    """Transposed conv (kernel ``2 * stride``) trimmed by ``stride`` on both sides."""

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        y = super().forward(x, state)
        if state is None:
            return y[..., self.trim :]
        key = (self, "started")
        carried = state.get(key)  # a fresh stream stacked with started ones reads as False
        started = carried[0] if carried is not None else torch.zeros(state.batch, dtype=torch.bool)
        state.put(key, torch.ones(state.batch, dtype=torch.bool, device=x.device))
        if bool(started.all()):
            return y
        if bool(started.any()):
            raise ValueError("a streamed Code2Wav call mixes first chunks with later ones; decode them apart")
        return y[..., self.trim :]


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), state)), state)


class DecoderBlock(nn.Module):
    """Snake, the two-sided-trim upsampling by ``rate``, residual units of dilation 1, 3, 9."""

    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), TwoSidedTrimUpsample(cin, cout, 2 * rate, rate), *(ResidualUnit(cout, d) for d in (1, 3, 9))]
        )

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, state)
        return x
