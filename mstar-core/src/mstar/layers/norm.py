"""RMS normalisation as Llama-family references compute it."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """RMS normalisation with a learned scale (parameter ``weight``, the HF key name).
    Normalises in float32 and scales in the input dtype, as Llama-family references do."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)
