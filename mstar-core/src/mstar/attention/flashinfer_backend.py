"""FlashInfer paged attention (CUDA, fp16/bf16). flashinfer is imported lazily: this module
imports on any machine, so its host-side planning is testable without a GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mstar.attention.backend import AttentionBackend
from mstar.attention.cross import CrossAttentionBatch
from mstar.attention.metadata import AttentionBatch
from mstar.kv.cache_manager import KVCacheManager

FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)
DEFAULT_WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class FlashInferPlanInputs:
    """An AttentionBatch in FlashInfer's CSR page-table form."""

    qo_indptr: torch.Tensor  # [B+1] int32
    paged_kv_indptr: torch.Tensor  # [B+1] int32, offsets into paged_kv_indices
    paged_kv_indices: torch.Tensor  # [sum pages] int32, each row's blocks in order
    paged_kv_last_page_len: torch.Tensor  # [B] int32, 1..block_size
    causal: bool
    custom_mask: torch.Tensor | None  # flat bool, concat of each row's [q_len, kv_len]


def flashinfer_plan_inputs(batch: AttentionBatch) -> FlashInferPlanInputs:
    block_size = batch.block_size
    kv_lens = batch.kv_lens.to(torch.int64)
    num_pages = (kv_lens + block_size - 1) // block_size
    paged_kv_indptr = torch.zeros(batch.num_rows + 1, dtype=torch.int64, device=kv_lens.device)
    torch.cumsum(num_pages, 0, out=paged_kv_indptr[1:])
    cols = torch.arange(batch.block_tables.shape[1], device=kv_lens.device)
    # Row-major boolean selection keeps each row's blocks contiguous and in order.
    paged_kv_indices = batch.block_tables[cols[None, :] < num_pages[:, None]]
    last_page_len = kv_lens - (num_pages - 1) * block_size

    causal_flags = {row.causal for row in batch.rows}
    # FlashInfer has one mask rule per plan; mixed rules are spelled out as a custom mask.
    needs_mask = batch.has_custom_masks or len(causal_flags) > 1
    return FlashInferPlanInputs(
        qo_indptr=batch.qo_indptr.to(torch.int32),
        paged_kv_indptr=paged_kv_indptr.to(torch.int32),
        paged_kv_indices=paged_kv_indices.to(torch.int32),
        paged_kv_last_page_len=last_page_len.to(torch.int32),
        causal=causal_flags == {True},
        custom_mask=_flat_custom_mask(batch) if needs_mask else None,
    )


def _flat_custom_mask(batch: AttentionBatch) -> torch.Tensor:
    device = batch.kv_lens.device
    parts = []
    for row, kv_len in zip(batch.rows, batch.kv_lens.tolist(), strict=True):
        if row.custom_mask is not None:
            mask = row.custom_mask.to(device)
        elif row.causal:
            # Bottom-right aligned: the new tokens are the last query_len of the stream.
            query_pos = torch.arange(kv_len - row.query_len, kv_len, device=device)
            mask = torch.arange(kv_len, device=device)[None, :] <= query_pos[:, None]
        else:
            mask = torch.ones(row.query_len, kv_len, dtype=torch.bool, device=device)
        parts.append(mask.reshape(-1))
    return torch.cat(parts)


class FlashInferAttentionBackend(AttentionBackend):
    """Ragged prefill, decode and mixed steps through FlashInfer's paged prefill kernel.

    The kernel plan needs the query head count and softmax scale, which only the first
    ``run`` of a step reveals, so the wrapper is planned there and reused by every later
    layer of the step (re-planned only if a layer passes a different scale).
    """

    name = "flashinfer"

    def __init__(self, kv: KVCacheManager, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> None:
        super().__init__(kv)
        if kv.device.type != "cuda":
            raise ValueError(f"FlashInferAttentionBackend needs a CUDA cache, got {kv.device}")
        if kv.dtype not in FLASHINFER_DTYPES:
            raise ValueError(
                f"FlashInferAttentionBackend supports {FLASHINFER_DTYPES} caches, got {kv.dtype}; "
                "use the torch backend"
            )
        import flashinfer  # optional extra mstar-core[cuda]

        self._workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=kv.device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, kv_layout="NHD"
        )
        self._inputs: FlashInferPlanInputs | None = None
        self._slot_mapping: torch.Tensor | None = None
        self._planned_for: tuple[int, float | None, torch.dtype] | None = None
        # Cross-attention (encoder–decoder nodes): a second wrapper over the rows' cross
        # streams, non-causal, reading the pages in place. Never run on a GPU yet.
        self._cross_wrapper: Any = None
        self._cross: tuple[CrossAttentionBatch, FlashInferPlanInputs] | None = None
        self._cross_planned_for: tuple[int, float | None, torch.dtype] | None = None

    def plan_cross(self, batch: CrossAttentionBatch) -> None:
        if self._cross_wrapper is None:
            import flashinfer

            self._cross_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, kv_layout="NHD")
        device = batch.block_tables.device
        q_lens = torch.tensor(batch.q_lens, dtype=torch.int64)
        kv_lens = torch.tensor(batch.kv_lens, dtype=torch.int64)
        pages = (kv_lens + batch.block_size - 1) // batch.block_size
        cols = torch.arange(batch.block_tables.shape[1])
        inputs = FlashInferPlanInputs(
            qo_indptr=torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(device, torch.int32),
            paged_kv_indptr=torch.cat([torch.zeros(1, dtype=torch.int64), pages.cumsum(0)]).to(device, torch.int32),
            paged_kv_indices=batch.block_tables.cpu()[cols[None, :] < pages[:, None]].to(device, torch.int32),
            paged_kv_last_page_len=(kv_lens - (pages - 1) * batch.block_size).to(device, torch.int32),
            causal=False,
            custom_mask=None,
        )
        self._cross = (batch, inputs)
        self._cross_planned_for = None

    def cross(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        if self._cross is None:
            raise RuntimeError("FlashInferAttentionBackend.cross called before plan_cross()")
        batch, inputs = self._cross
        if k is not None and v is not None and batch.write_slots is not None:
            self.kv.write(layer, batch.write_slots, k, v)
        key = (q.shape[1], scale, q.dtype)
        if self._cross_planned_for != key:
            self._cross_wrapper.plan(
                inputs.qo_indptr, inputs.paged_kv_indptr, inputs.paged_kv_indices, inputs.paged_kv_last_page_len,
                q.shape[1], self.kv.num_kv_heads, self.kv.head_dim, self.kv.block_size,
                causal=False, sm_scale=scale, q_data_type=q.dtype, kv_data_type=self.kv.dtype,
            )
            self._cross_planned_for = key
        return self._cross_wrapper.run(q, (self.kv.k_cache(layer), self.kv.v_cache(layer)))

    def plan(self, batch: AttentionBatch) -> None:
        self._inputs = flashinfer_plan_inputs(batch)
        self._slot_mapping = batch.slot_mapping
        self._planned_for = None

    def run(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        if self._inputs is None or self._slot_mapping is None:
            raise RuntimeError("FlashInferAttentionBackend.run called before plan()")
        self.kv.write(layer, self._slot_mapping, k, v)
        # Layers of another window re-plan (window_left: the keys left of the query it sees).
        key = (q.shape[1], scale, q.dtype, -1 if window is None else window - 1)
        if self._planned_for != key:
            self._plan_kernel(*key)
            self._planned_for = key
        return self._wrapper.run(q, (self.kv.k_cache(layer), self.kv.v_cache(layer)))

    def _plan_kernel(self, num_q_heads: int, scale: float | None, q_dtype: torch.dtype, window_left: int = -1) -> None:
        inputs = self._inputs
        assert inputs is not None
        self._wrapper.plan(
            inputs.qo_indptr,
            inputs.paged_kv_indptr,
            inputs.paged_kv_indices,
            inputs.paged_kv_last_page_len,
            num_q_heads,
            self.kv.num_kv_heads,
            self.kv.head_dim,
            self.kv.block_size,
            custom_mask=inputs.custom_mask,
            causal=inputs.causal,
            sm_scale=scale,
            q_data_type=q_dtype,
            kv_data_type=self.kv.dtype,
            window_left=window_left,
        )
