"""The torch backend's K/V of a run of decode steps, contiguous per row and head, carried
across steps.

A paged cache must be gathered into a padded batch before SDPA can read it, and gathering
every layer's whole K/V on every decode step costs as much memory traffic as the attention
itself. While consecutive decode steps keep the same rows (same streams, same order, each
one token longer), this buffer keeps last step's gathered K/V and only the new token's K/V
is written into it; any other step gathers afresh ("fill"). Its size is the rows' K/V plus
``HEADROOM_TOKENS`` per row: memory beside the paged cache's budget, so a step whose rows
would need more than ``1/BUDGET_DIVISOR`` of the paged cache's tokens does not use it (the
backend gathers per layer as without a buffer).

Layout per layer: ``[rows, capacity, kv_heads, head_dim]`` (the paged cache's NHD order), so
a fill is one gather of whole blocks and an append one indexed row copy per K and V. (A
per-head layout, [rows, kv_heads, capacity, head_dim], made SDPA slower on this CPU once the
buffer is larger than the caches: each head's keys then lie ``capacity`` rows apart.)
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from mstar.kv.cache_manager import KVCacheManager

HEADROOM_TOKENS = 64  # appended steps a fill allows before the rows outgrow it
BUDGET_DIVISOR = 4  # the buffer holds at most a quarter of the paged cache's tokens


@dataclass(frozen=True)
class BufferStep:
    """How one decode step uses the buffer."""

    fill: bool  # gather every row from the paged cache (else append the new token)
    capacity: int  # keys per row the buffer holds (a multiple of the block size)
    fill_blocks: torch.Tensor | None  # [B * capacity/block_size] blocks to gather, on fill
    append_index: torch.Tensor  # [B] flat buffer row b*capacity + kv_len-1 of the new token


class DecodeBuffer:
    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._rows: tuple[tuple[Hashable, str], ...] | None = None
        self._kv_lens: list[int] = []
        self._capacity = 0
        self._written: set[int] = set()  # layers whose new token the last step wrote
        self._storage: list[tuple[torch.Tensor, torch.Tensor]] = []  # flat K, V per layer
        # Per layer, K and V views of the storage as SDPA reads them, [B, Hkv, capacity, D]
        # (transposed), and as rows to write, [B*capacity, Hkv, D]; made at a fill and reused
        # by the appends after it (views made per call would cost ops every layer and step).
        self._views: list[tuple[tuple[torch.Tensor, torch.Tensor], ...]] = []
        self._step: BufferStep | None = None
        self._native: list[tuple[torch.Tensor, ...]] | None = None  # native_layers, per set of views

    def fits(self, rows: int, keys: int) -> bool:
        """Whether ``rows`` rows of ``keys`` padded keys (plus headroom) stay within the budget."""
        headroom = -(-HEADROOM_TOKENS // self.kv.block_size) * self.kv.block_size
        return rows * (keys + headroom) <= self.kv.num_blocks * self.kv.block_size // BUDGET_DIVISOR

    def invalidate(self) -> None:
        """A step that did not go through the buffer: its K/V is stale from now on."""
        self._rows = None
        self._step = None

    def plan(
        self, rows: tuple[tuple[Hashable, str], ...], kv_lens: list[int], keys: int, tables: torch.Tensor
    ) -> BufferStep:
        """``keys``: the step's padded keys per row; ``tables``: [B, >= keys/block_size] blocks."""
        bs = self.kv.block_size
        appendable = (
            rows == self._rows
            and len(self._written) == self.kv.num_layers
            and keys <= self._capacity
            and all(n == old + 1 for n, old in zip(kv_lens, self._kv_lens, strict=True))
        )
        fill_blocks = None
        if not appendable:
            self._capacity = keys + -(-HEADROOM_TOKENS // bs) * bs
            per_row = self._capacity // bs
            have = min(per_row, tables.shape[1])
            fill = torch.zeros(len(rows), per_row, dtype=torch.int64, device=tables.device)
            fill[:, :have] = tables[:, :have]  # columns past a row's blocks: block 0, masked out
            fill_blocks = fill.reshape(-1)
            self._ensure_storage(len(rows) * self._capacity)
            shape = (len(rows), self._capacity, self.kv.num_kv_heads, self.kv.head_dim)
            size = shape[0] * shape[1] * shape[2] * shape[3]
            self._views = [
                tuple((t[:size].view(shape).transpose(1, 2), t[:size].view(-1, *shape[2:])) for t in kv_pair)
                for kv_pair in self._storage
            ]
            self._native = None
        cap = self._capacity
        append_index = torch.tensor(
            [b * cap + n - 1 for b, n in enumerate(kv_lens)], dtype=torch.int64, device=self.kv.device
        )
        self._rows, self._kv_lens, self._written = rows, kv_lens, set()
        self._step = BufferStep(not appendable, self._capacity, fill_blocks, append_index)
        return self._step

    def keys_values(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, keys: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """After the layer's new K/V went into the paged cache: [B, Hkv, keys, D] K and V
        (views of the buffer), with ``k``/``v`` [B, Hkv, D] (the new token's) in place."""
        step = self._step
        assert step is not None, "DecodeBuffer.keys_values before plan"
        caches = (self.kv.k_cache(layer), self.kv.v_cache(layer))
        out = []
        for (buf, slots), cache, new in zip(self._views[layer], caches, (k, v), strict=True):
            if step.fill:
                assert step.fill_blocks is not None
                torch.index_select(cache, 0, step.fill_blocks, out=slots.view(-1, *cache.shape[1:]))
            else:
                slots.index_copy_(0, step.append_index, new if new.dtype == self.kv.dtype else new.to(self.kv.dtype))
            out.append(buf[:, :, :keys])
        self._written.add(layer)
        return out[0], out[1]

    def native_layers(self) -> list[tuple[torch.Tensor, ...]]:
        """Per layer, the tensors ``mstar_native::paged_attention`` writes and reads: the
        paged cache by slot and by block (K, V each), then this buffer as SDPA reads it and
        as rows to write (K, V each); the same views as ``keys_values`` uses, kept until
        the next fill remakes them."""
        if self._native is None:
            self._native = []
            for layer, ((k_read, k_rows), (v_read, v_rows)) in enumerate(self._views):
                k_slots, v_slots = self.kv.slot_rows(layer)
                self._native.append((k_slots, v_slots, self.kv.k_cache(layer), self.kv.v_cache(layer),
                                     k_read, v_read, k_rows, v_rows))
        return self._native

    def mark_written(self, layers: list[int]) -> None:
        """Layers whose new token was written outside ``keys_values`` (by the native op)."""
        self._written.update(layers)

    def _ensure_storage(self, tokens: int) -> None:
        need = tokens * self.kv.num_kv_heads * self.kv.head_dim
        if self._storage and self._storage[0][0].numel() >= need:
            return
        need += need // 4  # room to grow a little without reallocating
        self._storage = [
            tuple(torch.empty(need, dtype=self.kv.dtype, device=self.kv.device) for _ in range(2))  # type: ignore[misc]
            for _ in range(self.kv.num_layers)
        ]
