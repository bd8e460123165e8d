"""RMS normalisation as Llama-family references compute it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm_formula(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama-family formula: normalise in float32, scale in the input dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm_formula``; in float32 on the CPU through torch's fused kernel, which gives
    the same bits there (tests/core/layers/test_rms_norm.py) in one op instead of six: it
    matters where a step runs thousands of small ops (a TTS code predictor's depth loop)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return rms_norm_formula(x, weight, eps)


class RMSNorm(nn.Module):
    """RMS normalisation with a learned scale (parameter ``weight``, the HF key name), as
    ``rms_norm`` computes it."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
