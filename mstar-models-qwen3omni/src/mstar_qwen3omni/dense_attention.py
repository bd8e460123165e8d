"""A small dense KV cache with the attention backend's ``run(layer, q, k, v)`` call, for
sequences that live only inside one step (the code predictor's per-frame depth loop) and for
running the Talker outside the engine (tests, scripts). Every row adds the same number of
tokens per call; attention is causal over the row's cached keys."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DenseKVCache:
    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def length(self, layer: int = 0) -> int:
        return 0 if layer not in self.keys else int(self.keys[layer].shape[1])

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """``q`` [B*n, Hq, D], ``k``/``v`` [B*n, Hkv, D] (row-major: row b owns b*n..b*n+n-1)
        -> [B*n, Hq, D]; the new keys are appended to the row's cache first."""
        b = self.rows
        n = q.shape[0] // b
        k, v = k.view(b, n, *k.shape[1:]), v.view(b, n, *v.shape[1:])
        if layer in self.keys:
            k, v = torch.cat([self.keys[layer], k], dim=1), torch.cat([self.values[layer], v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        past = k.shape[1] - n
        groups = q.shape[1] // k.shape[2]
        qh = q.view(b, n, *q.shape[1:]).transpose(1, 2)  # [B, Hq, n, D]
        kh = k.transpose(1, 2).repeat_interleave(groups, dim=1)
        vh = v.transpose(1, 2).repeat_interleave(groups, dim=1)
        mask = torch.arange(k.shape[1], device=q.device)[None, :] <= (past + torch.arange(n, device=q.device))[:, None]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        return out.transpose(1, 2).reshape(b * n, *q.shape[1:])
