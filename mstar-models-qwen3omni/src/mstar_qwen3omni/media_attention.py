"""Bidirectional attention within segments of a packed sequence (the audio windows and the
per-frame vision segments), vectorised: segments are gathered into a few padded
``(segments, longest, heads, head_dim)`` batches, each run as one SDPA call with a key mask.

    plan = SegmentPlan.from_lengths(lengths)          # once per forward, reused by every layer
    out = segment_attention(q, k, v, plan, scale)     # q, k, v: (tokens, heads, head_dim)

Segments are grouped by length (longest first) so that a group's padding stays under
``max_waste`` of its real tokens: a large image batched with many small video frames does not
pad every frame to the image's size. Memory is per group ``segments x longest^2`` per head,
never ``tokens^2`` as one block-diagonal mask would be.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SegmentGroup:
    num_segments: int
    longest: int
    tokens: torch.Tensor  # (group tokens,) indices into the packed sequence
    slot: torch.Tensor  # (group tokens,) flat index into num_segments * longest
    key_mask: torch.Tensor | None  # (num_segments, 1, 1, longest); None when no padding


@dataclass(frozen=True)
class SegmentPlan:
    groups: list[SegmentGroup]

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, max_waste: float = 0.25) -> SegmentPlan:
        device = lengths.device
        sizes = [int(n) for n in lengths.tolist()]
        starts = [0]
        for n in sizes[:-1]:
            starts.append(starts[-1] + n)
        order = sorted((i for i in range(len(sizes)) if sizes[i] > 0), key=lambda i: -sizes[i])
        groups: list[SegmentGroup] = []
        while order:
            longest, members, real = sizes[order[0]], [], 0
            while order and (len(members) + 1) * longest <= (1 + max_waste) * (real + sizes[order[0]]):
                real += sizes[order[0]]
                members.append(order.pop(0))
            groups.append(cls._group(members, sizes, starts, longest, device))
        return cls(groups)

    @staticmethod
    def _group(members: list[int], sizes: list[int], starts: list[int], longest: int, device: torch.device) -> SegmentGroup:
        lens = torch.tensor([sizes[i] for i in members], device=device)
        first = torch.tensor([starts[i] for i in members], device=device)
        row = torch.repeat_interleave(torch.arange(len(members), device=device), lens)
        offset = torch.arange(int(lens.sum()), device=device) - (torch.cumsum(lens, 0) - lens)[row]
        mask = None
        if int(lens.min()) < longest:
            mask = (torch.arange(longest, device=device)[None, :] < lens[:, None])[:, None, None, :]
        return SegmentGroup(len(members), longest, first[row] + offset, row * longest + offset, mask)


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SegmentPlan, scale: float
) -> torch.Tensor:
    """Each token attends to every token of its own segment; returns (tokens, heads, head_dim)."""
    _, heads, dim = q.shape
    out = torch.empty_like(q)
    for g in plan.groups:

        def pad(x: torch.Tensor, g: SegmentGroup = g) -> torch.Tensor:
            padded = x.new_zeros(g.num_segments * g.longest, heads, dim)
            padded[g.slot] = x[g.tokens]
            return padded.view(g.num_segments, g.longest, heads, dim).transpose(1, 2)

        o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=g.key_mask, scale=scale)
        out[g.tokens] = o.transpose(1, 2).reshape(g.num_segments * g.longest, heads, dim)[g.slot]
    return out
