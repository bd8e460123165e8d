"""Bidirectional attention within segments of a packed sequence (the audio windows and the
per-frame vision segments), vectorised: segments are scattered into a padded
``(segments, longest, heads, head_dim)`` batch and run as one SDPA call with a key mask.

    plan = SegmentPlan.from_lengths(lengths)          # once per forward, reused by every layer
    out = segment_attention(q, k, v, plan, scale)     # q, k, v: (tokens, heads, head_dim)

Memory is ``segments x longest^2`` per head, never ``tokens^2`` as a block-diagonal mask would be.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SegmentPlan:
    """Where each packed token sits in the padded segment batch."""

    num_segments: int
    longest: int
    slot: torch.Tensor  # (tokens,) flat index into num_segments * longest
    key_mask: torch.Tensor  # (num_segments, 1, 1, longest) True where a key is real

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor) -> SegmentPlan:
        lengths = lengths.to(torch.long)
        num = int(lengths.numel())
        longest = int(lengths.max()) if num else 0
        starts = torch.cumsum(lengths, 0) - lengths
        segment = torch.repeat_interleave(torch.arange(num, device=lengths.device), lengths)
        offset = torch.arange(int(lengths.sum()), device=lengths.device) - starts[segment]
        slot = segment * longest + offset
        key_mask = torch.arange(longest, device=lengths.device)[None, :] < lengths[:, None]
        return cls(num, longest, slot, key_mask[:, None, None, :])

    def to(self, device: torch.device) -> SegmentPlan:
        return SegmentPlan(self.num_segments, self.longest, self.slot.to(device), self.key_mask.to(device))


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SegmentPlan, scale: float
) -> torch.Tensor:
    """Each token attends to every token of its own segment; returns (tokens, heads, head_dim)."""
    tokens, heads, dim = q.shape

    def pad(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(plan.num_segments * plan.longest, heads, dim)
        out[plan.slot] = x
        return out.view(plan.num_segments, plan.longest, heads, dim).transpose(1, 2)

    out = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=plan.key_mask, scale=scale)
    out = out.transpose(1, 2).reshape(plan.num_segments * plan.longest, heads, dim)
    return out[plan.slot]
