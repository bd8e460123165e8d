"""Pure-torch paged attention: the reference backend, correct on any device."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from mstar.attention.backend import AttentionBackend
from mstar.attention.cross import CrossAttentionBatch, TorchCrossAttention
from mstar.attention.decode_buffer import BufferStep, DecodeBuffer
from mstar.attention.metadata import AttentionBatch
from mstar.kv.cache_manager import KVCacheManager


@dataclass(frozen=True)
class _TorchPlan:
    """Per-step indices and mask; every layer of the step reuses them."""

    num_rows: int
    max_query_len: int
    num_tokens: int
    slot_mapping: torch.Tensor  # [T] where new K/V go
    # [B * Nb] cache block of each gathered block, row-major (padding: block 0, masked out).
    # Whole blocks are copied: one contiguous block_size*Hkv*D run each, far cheaper than
    # a per-key gather.
    kv_blocks: torch.Tensor
    keys_per_row: int  # Nb * block_size, the keys the gathered blocks hold per row
    # The longest row's kv_len: SDPA sees this many keys per row, not the block padding past
    # it (fewer keys to score, and no mask at all when every row has this length).
    num_keys: int
    # Token feeding each padded query [B*Qmax] and each token's padded position [T]; None
    # when every row has one query (decode): the padded layout is then the token layout.
    query_gather: torch.Tensor | None
    query_unpad: torch.Tensor | None
    # [B, 1, Qmax, num_keys] bool, True = may attend; None when every query may see every
    # key (decode steps whose rows all hold num_keys keys).
    mask: torch.Tensor | None
    buffer: BufferStep | None = None  # a decode step served by the DecodeBuffer
    # ``mask`` as SDPA's additive form (0 / -inf) per query dtype, made once for all layers:
    # SDPA would convert a bool mask this same way on every call.
    additive_masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    # The step's metadata: sliding windows compute each padded query's position from it,
    # only when a layer's window is shorter than the step's keys (most steps never need it).
    source: AttentionBatch | None = None
    # Per (window, dtype): ``mask`` narrowed to each query's window, for windowed layers.
    window_masks: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict)

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        if self.mask is None:
            return None
        mask = self.additive_masks.get(dtype)
        if mask is None:
            mask = torch.where(self.mask, 0.0, float("-inf")).to(dtype)
            self.additive_masks[dtype] = mask
        return mask

    def window_mask(self, window: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The additive mask of a layer whose queries see only the ``window`` keys ending at
        themselves (transformers' ``sliding_window``); the plain mask when no query of the
        step reaches that far back."""
        if self.num_keys <= window:
            return self.additive_mask(dtype)
        mask = self.window_masks.get((window, dtype))
        if mask is None:
            assert self.source is not None
            query_pos = _query_positions(self.source, self.kv_blocks.device, self.max_query_len)
            key_pos = torch.arange(self.num_keys, device=query_pos.device)
            inside = (key_pos[None, None, :] > query_pos[:, :, None] - window)[:, None]  # [B, 1, Qmax, K]
            allowed = inside if self.mask is None else inside & self.mask
            mask = self.window_masks[(window, dtype)] = torch.where(allowed, 0.0, float("-inf")).to(dtype)
        return mask


def _build_plan(batch: AttentionBatch, device: torch.device, kv_lens_list: list[int]) -> _TorchPlan:
    num_rows, max_q, max_kv = batch.num_rows, batch.max_query_len, batch.max_kv_len
    block_size = batch.block_size
    num_tokens = batch.num_tokens

    # The longest row's table holds ceil(max_kv / block_size) blocks, so the padded tables do.
    num_blocks = -(-max_kv // block_size)
    tables = batch.block_tables.to(device=device, dtype=torch.int64)[:, :num_blocks]

    query_gather = query_unpad = None
    mask: torch.Tensor | None = None
    if max_q == 1 and not batch.has_custom_masks:
        # Decode: each row's one query sits at kv_len - 1, so it may see every real key; a
        # mask is needed only to hide the keys past a shorter row's end.
        if min(kv_lens_list) < max_kv:
            kv_lens = batch.kv_lens.to(device=device, dtype=torch.int64)
            mask = (torch.arange(max_kv, device=device) < kv_lens[:, None])[:, None, :]
    else:
        kv_lens = batch.kv_lens.to(device=device, dtype=torch.int64)
        key_pos = torch.arange(max_kv, device=device)
        key_valid = key_pos < kv_lens[:, None]
        qo_indptr = batch.qo_indptr.to(device=device, dtype=torch.int64)
        q_lens = qo_indptr[1:] - qo_indptr[:-1]
        query_idx = torch.arange(max_q, device=device)
        if max_q > 1:
            query_valid = query_idx < q_lens[:, None]
            query_gather = torch.where(query_valid, qo_indptr[:-1, None] + query_idx, 0).reshape(-1)
            # output_size keeps repeat_interleave free of a device sync.
            token_row = torch.repeat_interleave(
                torch.arange(num_rows, device=device), q_lens, output_size=num_tokens
            )
            offset_in_row = torch.arange(num_tokens, device=device) - qo_indptr[token_row]
            query_unpad = token_row * max_q + offset_in_row
        # New tokens sit at the end of the stream, so query i of row b is at kv_len - q_len + i.
        # Padding queries land at or past kv_len and so see every real key: never an empty row.
        query_pos = (kv_lens - q_lens)[:, None] + query_idx
        causal_ok = key_pos[None, None, :] <= query_pos[:, :, None]
        row_causal = batch.causal.to(device)[:, None, None]
        mask = key_valid[:, None, :] & (causal_ok | ~row_causal)
        for b, row in enumerate(batch.rows):
            if row.custom_mask is not None:
                q_len, kv_len = row.custom_mask.shape
                mask[b, :q_len, :kv_len] = row.custom_mask.to(device)

    return _TorchPlan(
        num_rows=num_rows,
        max_query_len=max_q,
        num_tokens=num_tokens,
        slot_mapping=batch.slot_mapping.to(device=device, dtype=torch.int64),
        kv_blocks=tables.reshape(-1),
        keys_per_row=num_blocks * block_size,
        num_keys=max_kv,
        query_gather=query_gather,
        query_unpad=query_unpad,
        mask=None if mask is None else mask.unsqueeze(1),
        source=batch,
    )


def _query_positions(batch: AttentionBatch, device: torch.device, max_q: int) -> torch.Tensor:
    """[B, Qmax]: row b's new tokens sit at ``kv_len - q_len ..``; padding queries continue."""
    kv_lens = batch.kv_lens.to(device=device, dtype=torch.int64)
    qo = batch.qo_indptr.to(device=device, dtype=torch.int64)
    return (kv_lens - (qo[1:] - qo[:-1]))[:, None] + torch.arange(max_q, device=device)


class TorchAttentionBackend(AttentionBackend):
    """Gathers each row's paged K/V into a padded batch and runs one SDPA call per layer.

    Prefill, decode and mixed steps share the same path; ragged rows are handled by padding
    plus a mask built once per step in ``plan``. With ``decode_buffer`` (default: on CPU),
    runs of decode steps over the same rows keep the gathered K/V between steps and append
    to it (``mstar.attention.decode_buffer``) instead of gathering every step.
    """

    name = "torch"

    def __init__(self, kv: KVCacheManager, decode_buffer: bool | None = None) -> None:
        super().__init__(kv)
        self._plan: _TorchPlan | None = None
        use_buffer = kv.device.type == "cpu" if decode_buffer is None else decode_buffer
        self._buffer = DecodeBuffer(kv) if use_buffer else None
        self._cross = TorchCrossAttention(kv)

    def plan_cross(self, batch: CrossAttentionBatch) -> None:
        self._cross.plan(batch)

    def cross(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        return self._cross.run(layer, q, k, v, scale)

    def plan(self, batch: AttentionBatch) -> None:
        if batch.block_size != self.kv.block_size:
            raise ValueError(
                f"batch was built for block_size {batch.block_size}, "
                f"cache uses {self.kv.block_size}"
            )
        kv_lens = batch.kv_lens.tolist()
        plan = _build_plan(batch, self.kv.device, kv_lens)
        if self._buffer is not None:
            if batch.is_decode_only and self._buffer.fits(plan.num_rows, plan.keys_per_row):
                rows = tuple((row.request_id, row.stream) for row in batch.rows)
                tables = plan.kv_blocks.view(plan.num_rows, -1)
                step = self._buffer.plan(rows, kv_lens, plan.keys_per_row, tables)
                plan = replace(plan, buffer=step)
            else:
                self._buffer.invalidate()
        self._plan = plan

    def run(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        plan = self._plan
        if plan is None:
            raise RuntimeError("TorchAttentionBackend.run called before plan()")
        self._check_shapes(plan, q, k, v)
        num_q_heads, head_dim = q.shape[1], q.shape[2]

        self.kv.write(layer, plan.slot_mapping, k, v)
        rows, hkv, keys = plan.num_rows, self.kv.num_kv_heads, plan.num_keys

        # Whole blocks [B*Nb, bs, Hkv, D] -> [B, Hkv, keys, D] (a view: the padding past the
        # longest row is cut off, not copied).
        def gather(cache: torch.Tensor) -> torch.Tensor:
            blocks = cache.index_select(0, plan.kv_blocks)
            return blocks.view(rows, plan.keys_per_row, hkv, head_dim)[:, :keys].transpose(1, 2)

        if plan.buffer is not None:
            assert self._buffer is not None
            keys_t, values_t = self._buffer.keys_values(layer, k, v, keys)
        else:
            keys_t, values_t = gather(self.kv.k_cache(layer)), gather(self.kv.v_cache(layer))
        if keys_t.dtype != q.dtype:  # a cache kept in another dtype than the activations
            keys_t, values_t = keys_t.to(q.dtype), values_t.to(q.dtype)
        if plan.query_gather is None and plan.max_query_len == 1:
            queries = q.unsqueeze(2)  # [T=B, Hq, D] -> [B, Hq, 1, D]: one view, not two
        else:
            padded_q = q if plan.query_gather is None else q.index_select(0, plan.query_gather)
            queries = padded_q.view(rows, plan.max_query_len, num_q_heads, head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            queries,
            keys_t,
            values_t,
            attn_mask=plan.additive_mask(q.dtype) if window is None else plan.window_mask(window, q.dtype),
            scale=scale,
            enable_gqa=num_q_heads != hkv,
        )
        if plan.max_query_len == 1:
            return out.squeeze(2)
        out = out.transpose(1, 2).reshape(-1, num_q_heads, head_dim)
        return out if plan.query_unpad is None else out.index_select(0, plan.query_unpad)

    def native_decode_step(self) -> tuple | None:
        """What ``mstar_native::paged_attention`` needs to run this step itself
        (``mstar.attention.native_attention``): a tuple when the planned step is a decode
        step served by the decode buffer, else None. The op writes the caches and the buffer
        as ``run`` does; ``native_layers_written`` then records its layers."""
        plan = self._plan
        if plan is None or plan.buffer is None or plan.max_query_len != 1 or self._buffer is None:
            return None
        step = plan.buffer
        return (self._buffer.native_layers(), plan.slot_mapping, step.fill, step.fill_blocks,
                step.append_index, plan.num_keys, plan.additive_mask(self.kv.dtype))

    def native_layers_written(self, layers: list[int]) -> None:
        """The layers whose new K/V ``mstar_native::paged_attention`` wrote this step."""
        assert self._buffer is not None
        self._buffer.mark_written(layers)

    def _check_shapes(
        self, plan: _TorchPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        kv_shape = (plan.num_tokens, self.kv.num_kv_heads, self.kv.head_dim)
        if tuple(k.shape) != kv_shape or tuple(v.shape) != kv_shape:
            raise ValueError(
                f"k/v must be [T, Hkv, D] = {list(kv_shape)}, got {list(k.shape)} / {list(v.shape)}"
            )
        if q.dim() != 3 or q.shape[0] != plan.num_tokens or q.shape[2] != self.kv.head_dim:
            raise ValueError(
                f"q must be [T={plan.num_tokens}, Hq, D={self.kv.head_dim}], got {list(q.shape)}"
            )
        if q.shape[1] % self.kv.num_kv_heads != 0:
            raise ValueError(
                f"query heads ({q.shape[1]}) must be a multiple of kv heads ({self.kv.num_kv_heads})"
            )
