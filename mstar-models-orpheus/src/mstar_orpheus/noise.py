"""Reproducible noise for SNAC's noise blocks.

SNAC draws fresh Gaussian noise on every decode. Here the noise of a window is a pure
function of the window's codes (counter-based, no generator state), so identical codes give
identical audio whatever else is batched, and a seeded request's WAV is byte-identical on
every repeat, while keeping the noise the checkpoint was trained with.
"""

from __future__ import annotations

import math

import torch
from mstar.sampling import random_bits, uniform

_BLOCK_STRIDE = 1 << 40  # counter space per noise block (far beyond any window length)


def window_seeds(windows: torch.Tensor) -> torch.Tensor:
    """[B, n] codes -> [B] int64 seeds mixing every code and its position."""
    steps = torch.arange(windows.shape[-1], device=windows.device)
    return random_bits(windows.to(torch.int64), steps).sum(dim=-1)


class CodeSeededNoise:
    def __init__(self, seeds: torch.Tensor) -> None:
        self.seeds = seeds

    def __call__(self, block: int, batch: int, length: int) -> torch.Tensor:
        assert batch == self.seeds.shape[0]
        idx = torch.arange(length, device=self.seeds.device) * 2 + block * _BLOCK_STRIDE
        u1 = uniform(self.seeds[:, None], idx[None, :])
        u2 = uniform(self.seeds[:, None], idx[None, :] + 1)
        # Box-Muller; 1 - u1 lies in (0, 1], so the log is finite.
        normal = torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)
        return normal.to(torch.float32)[:, None, :]
