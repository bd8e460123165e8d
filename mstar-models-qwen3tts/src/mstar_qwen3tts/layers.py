"""Building blocks shared by the talker, the code predictor and the codec decoder.

The talker's step runs thousands of small ops per frame (the code predictor's depth loop),
so it uses forms of two that compute the same bits for fewer ops: core's ``rms_norm``
(torch's fused kernel on the CPU in float32), and RoPE rotating with one ``roll`` against a sine table
whose first half is negated (``signed_sin``, ``rotate``) instead of slicing, negating and
concatenating each head (tests/qwen3tts/test_qwen3tts_fused_layers.py). One matmul over
concatenated q/k/v or gate/up weights was tried and not kept: on this CPU it saved ~4 us a
layer at the mid preset's widths and measured slower at the released ones (1.73 vs 1.58 ms
for q/k/v at hidden 1024, 8 rows, one thread, load ~2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mstar.layers import RMSNorm, apply_rope
from mstar.layers.norm import rms_norm
from torch import nn

__all__ = [
    "GatedMLP", "RMSNorm", "apply_rope", "rope_cos_sin", "rotate", "rms_norm", "signed_sin",
]


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


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with the first half of its last dim negated: ``rotate``'s sine table."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """``apply_rope(x, cos, sin)`` with ``sin_signed = signed_sin(sin)``: rotate-half is the
    halves swapped (one ``roll``) with the first half negated, and the negation moves into
    the table exactly ((-a) * b == a * (-b) in IEEE arithmetic)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed
