"""Building blocks shared by the talker, the code predictor and the codec decoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mstar.layers import RMSNorm, apply_rope
from torch import nn

__all__ = ["GatedMLP", "RMSNorm", "apply_rope", "rope_cos_sin"]


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of rotary embeddings for ``positions`` (any shape), shape ``[*positions, D]``.

    The talker's multimodal RoPE reduces to this: for speech every position id is the
    same along its three axes.
    """
    device = positions.device
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).to(torch.float32) / head_dim)
    freqs = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


