"""The 3-axis rotary embedding of V-JEPA 2 (frame, row, column), written from the paper's
description and checked against ``transformers`` and upstream.

Each axis rotates its own slice of the head dimension. The released checkpoints were trained
with the cos/sin halves tiled (``[c0..c_{n-1}, c0..c_{n-1}]``) while the rotation pairs
neighbouring channels (2j, 2j+1); we keep that exactly, or the weights would not match.
"""

from __future__ import annotations

import torch


def axis_dim(head_dim: int) -> int:
    """Channels rotated per axis: the largest even number <= head_dim / 3."""
    return 2 * ((head_dim // 3) // 2)


def _rotate_slice(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x [..., N, d], pos broadcastable to [..., N] (float) → x rotated by pos."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = 1.0 / 10000 ** (torch.arange(half, dtype=x.dtype, device=x.device) / half)
    angles = pos.to(x.dtype).unsqueeze(-1) * inv_freq  # [..., N, d/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    pairs = x.unflatten(-1, (half, 2))
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return x * cos + swapped * sin


def rotate(x: torch.Tensor, frame: torch.Tensor, row: torch.Tensor | None, col: torch.Tensor | None) -> torch.Tensor:
    """Rotate q or k [B, H, N, D]. ``frame``/``row``/``col`` are [N] or [B, 1, N] positions;
    ``row``/``col`` None rotates the frame axis only (V-JEPA 2-AC's action/state tokens)."""
    n = axis_dim(x.shape[-1])
    parts = [_rotate_slice(x[..., :n], frame)]
    if row is not None and col is not None:
        parts.append(_rotate_slice(x[..., n : 2 * n], row))
        parts.append(_rotate_slice(x[..., 2 * n : 3 * n], col))
        rest = x[..., 3 * n :]
    else:
        rest = x[..., n:]
    if rest.shape[-1]:
        parts.append(rest)
    return torch.cat(parts, dim=-1)


def grid_positions(ids: torch.Tensor, grid_h: int, grid_w: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat token ids (frame-major, then row, then column) → (frame, row, col)."""
    per_frame = grid_h * grid_w
    frame = ids // per_frame
    within = ids - frame * per_frame
    row = within // grid_w
    return frame, row, within - row * grid_w
