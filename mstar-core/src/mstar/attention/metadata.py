"""Per-step attention metadata shared by every attention backend."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

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
        parsed = tuple(AttentionRow(*row) for row in rows)
        query_lens = [row.query_len for row in parsed]
        if kv_lens is None:
            kv_lens = [kv.num_tokens(row.request_id, row.stream) for row in parsed]
        else:
            kv_lens = list(kv_lens)
        tables = [kv.block_table(row.request_id, row.stream) for row in parsed]
        for row, kv_len in zip(parsed, kv_lens, strict=True):
            _validate_row(row, kv_len)
        # Two rows on one stream would both claim its last tokens' cache slots.
        if len({(row.request_id, row.stream) for row in parsed}) != len(parsed):
            raise ValueError("AttentionBatch: a (request_id, stream) appears in more than one row")

        # Everything is computed on the host from Python ints, then moved in one hop each:
        # a few list comprehensions cost less per step than a dozen small tensor ops.
        block_size = kv.block_size
        qo_indptr = [0, *accumulate(query_lens)]
        positions = [p for q, n in zip(query_lens, kv_lens, strict=True) for p in range(n - q, n)]
        slot_mapping = [
            table[p // block_size] * block_size + p % block_size
            for q, n, table in zip(query_lens, kv_lens, tables, strict=True)
            for p in range(n - q, n)
        ]
        max_blocks = max(1, *(len(t) for t in tables))
        # Padded with block 0: always a valid index to gather.
        padded = [t + [0] * (max_blocks - len(t)) for t in tables]
        return cls(
            rows=parsed,
            block_size=block_size,
            max_query_len=max(query_lens),
            max_kv_len=max(kv_lens),
            qo_indptr=torch.tensor(qo_indptr, dtype=torch.int32, device=device),
            kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            causal=torch.tensor([row.causal for row in parsed], dtype=torch.bool, device=device),
        )


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
