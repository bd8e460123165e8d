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
from mstar.layers.codec_blocks import ResidualUnit, SnakeBeta
from mstar.layers.streaming import CausalConvTranspose1d, StreamState
from torch import nn


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
