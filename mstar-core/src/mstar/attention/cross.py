"""Cross-attention over a per-request cache written once (encoder–decoder models).

A KV node whose layout names a cross-attention signal (``KVCacheLayout.cross_attention``)
holds, beside each request's self-attention stream, a second stream ``cross`` in the same
block pool: one position per encoder state. The engine reserves it at the request's first
forward on the node (counted in the KV budget, so admission and preemption see it), the
node's layers write it in that forward from the encoder states, and every later step
only reads it: no causal rule, no new positions. Preemption frees it with the rest of the
request's cache; the request's first replayed forward writes it again from the encoder
states the request still holds (the encoder does not run again).

``CrossAttentionBatch`` is a step's metadata; ``TorchCrossAttention`` the torch backend's
reading of it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mstar.kv.cache_manager import KVCacheManager

CROSS_STREAM = "cross"
# Up to this many bytes of gathered cross K/V (all layers) are kept between steps of the
# same rows (a run of decode steps), so they are gathered once, not every step.
DEFAULT_REUSE_BYTES = 256 << 20


@dataclass(frozen=True, eq=False)
class CrossAttentionBatch:
    """One step's cross-attention: row b's ``q_lens[b]`` queries (the same rows and token
    order as the step's self-attention) attend to all ``kv_lens[b]`` positions of its
    cross stream. Rows in ``write_rows`` have their cross K/V written this step, at
    ``write_slots`` (each such row's positions in order, rows in batch order)."""

    request_ids: tuple[Hashable, ...]
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    block_size: int
    block_tables: torch.Tensor  # [B, max blocks] int32, padded with block 0
    write_rows: tuple[int, ...]
    write_slots: torch.Tensor | None  # [sum kv_lens of write_rows] int64

    @property
    def num_rows(self) -> int:
        return len(self.request_ids)

    @classmethod
    def build(
        cls, request_ids: Sequence[Hashable], q_lens: Sequence[int], kv: KVCacheManager,
        device: torch.device, write_rows: Sequence[int] = (),
    ) -> CrossAttentionBatch:
        """Call after the step's cross streams were reserved (``kv.append(rid, CROSS_STREAM, n)``)."""
        lens = [kv.num_tokens(rid, CROSS_STREAM) for rid in request_ids]
        for rid, n in zip(request_ids, lens, strict=True):
            if n == 0:
                raise ValueError(f"request {rid!r} has no cross-attention cache on this node")
        bs = kv.block_size
        width = -(-max(lens) // bs)
        tables, _, _ = kv.table_rows([(rid, CROSS_STREAM) for rid in request_ids], width)
        slots = None
        if write_rows:
            parts = []
            for i in write_rows:
                pos = np.arange(lens[i])
                parts.append(tables[i, pos // bs].astype(np.int64) * bs + pos % bs)
            slots = torch.from_numpy(np.concatenate(parts)).to(device)
        return cls(tuple(request_ids), tuple(q_lens), tuple(lens), bs, torch.from_numpy(tables).to(device),
                   tuple(write_rows), slots)


class TorchCrossAttention:
    """Cross-attention with SDPA: each row's cross K/V gathered into a padded batch, with a
    key-padding mask where rows' lengths differ. The gathered K/V of a layer are kept while
    the next steps have the same rows and nothing was written (immutable caches): a run of
    decode steps gathers once, within ``reuse_bytes``."""

    def __init__(self, kv: KVCacheManager, reuse_bytes: int = DEFAULT_REUSE_BYTES) -> None:
        self.kv = kv
        self.reuse_bytes = reuse_bytes
        self._batch: CrossAttentionBatch | None = None
        self._rows_key: tuple | None = None
        self._gathered: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._mask: torch.Tensor | None = None
        self._masks: dict[torch.dtype, torch.Tensor] = {}
        self._query_gather: torch.Tensor | None = None
        self._query_unpad: torch.Tensor | None = None

    def plan(self, batch: CrossAttentionBatch) -> None:
        device = self.kv.device
        key = (batch.request_ids, batch.kv_lens)
        if batch.write_rows or key != self._rows_key:
            self._gathered.clear()  # other rows, or caches rewritten: gather again
        self._rows_key = key
        self._batch = batch
        max_kv = max(batch.kv_lens)
        self._masks = {}
        self._mask = None
        if min(batch.kv_lens) < max_kv:  # hide each shorter row's padding keys
            lens = torch.tensor(batch.kv_lens, device=device)
            self._mask = (torch.arange(max_kv, device=device) < lens[:, None])[:, None, None, :]
        max_q = max(batch.q_lens)
        self._query_gather = self._query_unpad = None
        if max_q > 1:
            gather, unpad, start = [], [], 0
            for b, n in enumerate(batch.q_lens):
                gather.extend(range(start, start + n))
                gather.extend([0] * (max_q - n))  # padding queries: any token, cut below
                unpad.extend(range(b * max_q, b * max_q + n))
                start += n
            self._query_gather = torch.tensor(gather, device=device)
            self._query_unpad = torch.tensor(unpad, device=device)

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
            scale: float | None = None) -> torch.Tensor:
        batch = self._batch
        if batch is None:
            raise RuntimeError("cross-attention run before plan_cross()")
        if (k is None) != (batch.write_slots is None) or (k is None) != (v is None):
            raise ValueError(
                "cross(): pass k and v exactly when the step writes cross-attention caches "
                f"(rows {list(batch.write_rows)} write this step)"
            )
        if k is not None:
            assert v is not None and batch.write_slots is not None
            if k.shape[0] != batch.write_slots.shape[0]:
                raise ValueError(
                    f"cross(): k/v hold {k.shape[0]} positions, the writing rows' caches "
                    f"{batch.write_slots.shape[0]}"
                )
            self.kv.write(layer, batch.write_slots, k, v)
        keys, values = self._keys_values(layer)
        if keys.dtype != q.dtype:
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        rows, hq, d = batch.num_rows, q.shape[1], q.shape[2]
        max_q = max(batch.q_lens)
        padded = q if self._query_gather is None else q.index_select(0, self._query_gather)
        queries = padded.view(rows, max_q, hq, d).transpose(1, 2)
        mask = self._additive_mask(q.dtype)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=hq != keys.shape[1])
        out = out.transpose(1, 2).reshape(rows * max_q, hq, d)
        return out if self._query_unpad is None else out.index_select(0, self._query_unpad)

    def _keys_values(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        kept = self._gathered.get(layer)
        if kept is not None:
            return kept
        batch = self._batch
        assert batch is not None
        bs, hkv, d = batch.block_size, self.kv.num_kv_heads, self.kv.head_dim
        blocks = batch.block_tables.to(torch.int64).reshape(-1)
        width = batch.block_tables.shape[1]
        max_kv = max(batch.kv_lens)

        def gather(cache: torch.Tensor) -> torch.Tensor:
            got = cache.index_select(0, blocks).view(batch.num_rows, width * bs, hkv, d)[:, :max_kv]
            return got.transpose(1, 2)

        kv = gather(self.kv.k_cache(layer)), gather(self.kv.v_cache(layer))
        per_layer = 2 * kv[0].numel() * kv[0].element_size()
        if per_layer * self.kv.num_layers <= self.reuse_bytes:
            self._gathered[layer] = kv
        return kv

    def _additive_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        if self._mask is None:
            return None
        mask = self._masks.get(dtype)
        if mask is None:
            mask = self._masks[dtype] = torch.where(self._mask, 0.0, float("-inf")).to(dtype)
        return mask
