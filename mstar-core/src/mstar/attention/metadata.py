"""Per-step attention metadata shared by every attention backend."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

import numpy as np
import torch

from mstar.kv.cache_manager import KVCacheManager


class AttentionRow(NamedTuple):
    """One row of a step: ``query_len`` new tokens of one cache stream.

    ``custom_mask`` ([query_len, kv_len], True = may attend) replaces the causal rule for
    the row when given; ``causal=False`` without a mask means full (bidirectional) attention.
    """

    request_id: Hashable
    stream: str
    query_len: int
    causal: bool = True
    custom_mask: torch.Tensor | None = None


RowLike = AttentionRow | tuple


@dataclass(frozen=True, eq=False)
class AttentionBatch:
    """What one engine step's attention needs, in flat ragged form.

    Tokens of all rows are concatenated along one dim of length ``num_tokens`` (T); row b
    owns ``qo_indptr[b]:qo_indptr[b+1]``. Index tensors live on ``device``; ``qo_indptr``,
    ``kv_lens`` and ``block_tables`` are int32 (FlashInfer's convention), ``slot_mapping``
    and ``positions`` int64 (indexing and RoPE).
    """

    rows: tuple[AttentionRow, ...]
    block_size: int
    max_query_len: int
    max_kv_len: int
    qo_indptr: torch.Tensor  # [B+1]
    kv_lens: torch.Tensor  # [B]
    block_tables: torch.Tensor  # [B, max_blocks], padded with block 0
    slot_mapping: torch.Tensor  # [T] flat cache slot each new token's K/V is written to
    positions: torch.Tensor  # [T] absolute position of each new token
    causal: torch.Tensor  # [B] bool, the row's rule when it has no custom mask

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    @property
    def has_custom_masks(self) -> bool:
        return any(row.custom_mask is not None for row in self.rows)

    @classmethod
    def build(
        cls,
        rows: Sequence[RowLike],
        kv: KVCacheManager,
        device: torch.device | str | None = None,
        kv_lens: Sequence[int] | None = None,
    ) -> AttentionBatch:
        """Build the step's metadata. Call after ``kv.append`` for the step's new tokens:
        each row's new tokens are the last ``query_len`` of its stream. ``kv_lens``: the
        streams' lengths, when the caller already knows them (else read from ``kv``)."""
        if not rows:
            raise ValueError("AttentionBatch needs at least one row")
        device = torch.device(device) if device is not None else kv.device
        parsed = tuple(row if isinstance(row, AttentionRow) else AttentionRow(*row) for row in rows)
        streams = [(row.request_id, row.stream) for row in parsed]
        # Two rows on one stream would both claim its last tokens' cache slots.
        if len(set(streams)) != len(parsed):
            raise ValueError("AttentionBatch: a (request_id, stream) appears in more than one row")
        q_lens = [row.query_len for row in parsed]
        lens = [kv.num_tokens(rid, s) for rid, s in streams] if kv_lens is None else list(kv_lens)
        for row, kv_len in zip(parsed, lens, strict=True):
            if row.custom_mask is not None or not 1 <= row.query_len <= kv_len:
                _validate_row(row, kv_len)

        # Per-row scalars in Python, per-token arrays in numpy (one op for all rows, not a
        # Python loop per row), then one hop each to the device.
        block_size, num_rows = kv.block_size, len(parsed)
        num_tokens, max_kv = sum(q_lens), max(lens)
        n = np.array(lens, dtype=np.int64)
        tables, held = kv.table_rows(streams, max(1, -(-max_kv // block_size)))
        short = held * block_size < n
        if short.any():
            i = int(short.argmax())
            raise ValueError(
                f"row (request {parsed[i].request_id!r}, stream {parsed[i].stream!r}): kv_len {lens[i]} but the "
                f"cache holds {int(held[i])} blocks of {block_size}; append the step's tokens to the KV cache "
                "before building the batch"
            )
        qo_indptr = np.array([0, *accumulate(q_lens)], dtype=np.int64)
        if num_tokens == num_rows:  # decode: one token per row, at its last position
            token_row, positions = np.arange(num_rows), n - 1
        else:
            token_row = np.repeat(np.arange(num_rows), q_lens)
            positions = np.arange(num_tokens) - qo_indptr[token_row] + (n - q_lens)[token_row]
        slot_mapping = tables[token_row, positions // block_size].astype(np.int64) * block_size + positions % block_size
        return cls(
            rows=parsed,
            block_size=block_size,
            max_query_len=max(q_lens),
            max_kv_len=max_kv,
            qo_indptr=_to(qo_indptr.astype(np.int32), device),
            kv_lens=_to(n.astype(np.int32), device),
            block_tables=_to(tables, device),
            slot_mapping=_to(slot_mapping, device),
            positions=_to(positions, device),
            causal=_to(np.array([row.causal for row in parsed], dtype=np.bool_), device),
        )


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device)


def _validate_row(row: AttentionRow, kv_len: int) -> None:
    where = f"row (request {row.request_id!r}, stream {row.stream!r})"
    if row.query_len < 1:
        raise ValueError(f"{where}: query_len must be >= 1, got {row.query_len}")
    if kv_len < row.query_len:
        raise ValueError(
            f"{where}: cache holds {kv_len} tokens but query_len is {row.query_len}; "
            "append the step's tokens to the KV cache before building the batch"
        )
    mask = row.custom_mask
    if mask is None:
        return
    if mask.dtype != torch.bool or tuple(mask.shape) != (row.query_len, kv_len):
        raise ValueError(
            f"{where}: custom_mask must be a bool tensor of shape "
            f"({row.query_len}, {kv_len}), got {mask.dtype} {tuple(mask.shape)}"
        )
    # A query that may see nothing has no defined softmax: reject instead of emitting NaN.
    if not bool(mask.any(dim=1).all()):
        raise ValueError(f"{where}: custom_mask has a query row that attends to nothing")
