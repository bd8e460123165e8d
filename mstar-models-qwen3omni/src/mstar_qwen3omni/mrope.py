"""Interleaved 3-D multimodal RoPE (M-RoPE) of the Qwen3-Omni Thinker.

Every rotary frequency pair j of a head reads one of three position axes (time, height,
width): pairs j = 1, 4, 7, ... below ``3 * section[1]`` read height, j = 2, 5, 8, ... below
``3 * section[2]`` read width, every other pair reads time (the *interleaved* layout, not
three contiguous chunks). Text positions are equal on all three axes, so a text-only
prompt gets plain 1-D RoPE.
"""

from __future__ import annotations

import torch
from torch import nn


def axis_of_frequency(half_dim: int, section: tuple[int, int, int]) -> torch.Tensor:
    """[half_dim] long: which position axis (0 t, 1 h, 2 w) each frequency pair reads."""
    j = torch.arange(half_dim)
    axis = torch.zeros(half_dim, dtype=torch.long)
    axis[(j % 3 == 1) & (j < 3 * section[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * section[2])] = 2
    return axis


class MRotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float, section: tuple[int, int, int]) -> None:
        super().__init__()
        # Plain attributes, not buffers: they stay float32 whatever dtype the model is cast to
        # and never meet a meta-device construction.
        with torch.device("cpu"):
            self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            self.axis = axis_of_frequency(head_dim // 2, section)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` [3, T] (t, h, w; float or int) -> cos, sin [T, 1, head_dim] in ``dtype``."""
        if self.inv_freq.device != positions.device:
            self.inv_freq, self.axis = self.inv_freq.to(positions.device), self.axis.to(positions.device)
        pos = positions.to(torch.float32)[self.axis]  # [half, T]: each pair's own axis
        freqs = pos.transpose(0, 1) * self.inv_freq  # float32, as the reference computes it
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)
