"""Per-step attention metadata shared by every attention backend."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
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
SMALL_BATCH = 4  # rows up to which build works on Python lists (AttentionBatch._build_small)


@dataclass(frozen=True)
class DecodeRun:
    """Host copies of a decode step's metadata (one token per row, no custom mask), from
    which the next step over the same rows is built (``AttentionBatch.build(previous=)``)."""

    lens: np.ndarray  # int64 [B]: each row's cache length after that step
    table_rows: np.ndarray  # int64 [B]: the rows' streams' rows in the KV manager's tables
    tables_version: int  # the KV manager's ``tables_version`` then


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
    # Decode steps of more than SMALL_BATCH rows: what the next step over the same rows
    # starts from (None otherwise).
    decode_run: DecodeRun | None = field(default=None, repr=False)

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
        previous: AttentionBatch | None = None,
    ) -> AttentionBatch:
        """Build the step's metadata. Call after ``kv.append`` for the step's new tokens:
        each row's new tokens are the last ``query_len`` of its stream. ``kv_lens``: the
        streams' lengths, when the caller already knows them (else read from ``kv``).

        ``previous``: the last step's batch of the same caller. When it was a decode step
        and this one is the next decode step of the same rows (the same streams in the same
        order, each one position longer, no stream created or freed since), only what moved
        is computed: lengths and positions advance by one, the tables are one gather of the
        remembered rows, and the rest is the previous step's. The result equals a full build."""
        if not rows:
            raise ValueError("AttentionBatch needs at least one row")
        device = torch.device(device) if device is not None else kv.device
        parsed = tuple(row if isinstance(row, AttentionRow) else AttentionRow(*row) for row in rows)
        run = previous.decode_run if previous is not None else None
        if run is not None and kv_lens is not None and run.tables_version == kv.tables_version and parsed == previous.rows:
            n = np.array(kv_lens, dtype=np.int64)
            if np.array_equal(n, run.lens + 1):
                return cls._next_decode(previous, run, n, kv, device)  # type: ignore[arg-type]
        streams = [(row.request_id, row.stream) for row in parsed]
        # Two rows on one stream would both claim its last tokens' cache slots.
        if len(set(streams)) != len(parsed):
            raise ValueError("AttentionBatch: a (request_id, stream) appears in more than one row")
        q_lens = [row.query_len for row in parsed]
        lens = [kv.num_tokens(rid, s) for rid, s in streams] if kv_lens is None else list(kv_lens)
        for row, kv_len in zip(parsed, lens, strict=True):
            if row.custom_mask is not None or not 1 <= row.query_len <= kv_len:
                _validate_row(row, kv_len)

        block_size, num_rows = kv.block_size, len(parsed)
        num_tokens, max_kv = sum(q_lens), max(lens)
        width = max(1, -(-max_kv // block_size))
        if num_rows <= SMALL_BATCH:
            return cls._build_small(parsed, streams, q_lens, lens, kv, device, width)

        # Per-row scalars in Python, per-token arrays in numpy (one op for all rows, not a
        # Python loop per row), then one hop each to the device.
        n = np.array(lens, dtype=np.int64)
        tables, held, table_rows = kv.table_rows(streams, width)
        short = held * block_size < n
        if short.any():
            i = int(short.argmax())
            raise _short_cache(parsed[i], lens[i], int(held[i]), block_size)
        qo_indptr = np.array([0, *accumulate(q_lens)], dtype=np.int64)
        run = None
        if num_tokens == num_rows:  # decode: one token per row, at its last position
            token_row, positions = np.arange(num_rows), n - 1
            if table_rows is not None and all(row.custom_mask is None for row in parsed):
                run = DecodeRun(n, table_rows, kv.tables_version)
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
            decode_run=run,
        )

    @classmethod
    def _next_decode(
        cls, previous: AttentionBatch, run: DecodeRun, n: np.ndarray, kv: KVCacheManager, device: torch.device
    ) -> AttentionBatch:
        """The decode step after ``previous`` over the same rows (``build(previous=)``)."""
        block_size = previous.block_size
        positions = run.lens  # each row's new token sits where the last step's length was
        max_kv = int(n.max())
        tables, held = kv.tables_of_rows(run.table_rows, max(1, -(-max_kv // block_size)))
        short = held * block_size < n
        if short.any():
            i = int(short.argmax())
            raise _short_cache(previous.rows[i], int(n[i]), int(held[i]), block_size)
        row_index = np.arange(len(n))
        slot_mapping = tables[row_index, positions // block_size].astype(np.int64) * block_size + positions % block_size
        return cls(
            rows=previous.rows,
            block_size=block_size,
            max_query_len=1,
            max_kv_len=max_kv,
            qo_indptr=previous.qo_indptr,
            kv_lens=_to(n.astype(np.int32), device),
            block_tables=_to(tables, device),
            slot_mapping=_to(slot_mapping, device),
            positions=_to(positions.copy(), device),
            causal=previous.causal,
            decode_run=DecodeRun(n, run.table_rows, run.tables_version),
        )

    @classmethod
    def _build_small(
        cls, parsed: tuple[AttentionRow, ...], streams: list[tuple[Hashable, str]], q_lens: list[int],
        lens: list[int], kv: KVCacheManager, device: torch.device, width: int,
    ) -> AttentionBatch:
        """The same metadata from Python lists: for a few rows, a dozen small numpy calls
        cost more than the loops they replace (measured in the engine: 72 against 39 us a
        decode step at one row, its caches cold after the forward)."""
        block_size = kv.block_size
        tables = [kv.block_table(rid, s) for rid, s in streams]
        for row, n, table in zip(parsed, lens, tables, strict=True):
            if len(table) * block_size < n:
                raise _short_cache(row, n, len(table), block_size)
        spans = [range(n - q, n) for q, n in zip(q_lens, lens, strict=True)]
        return cls(
            rows=parsed,
            block_size=block_size,
            max_query_len=max(q_lens),
            max_kv_len=max(lens),
            qo_indptr=torch.tensor([0, *accumulate(q_lens)], dtype=torch.int32, device=device),
            kv_lens=torch.tensor(lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor([(t + [0] * width)[:width] for t in tables], dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(
                [t[p // block_size] * block_size + p % block_size for t, span in zip(tables, spans, strict=True) for p in span],
                dtype=torch.int64, device=device,
            ),
            positions=torch.tensor([p for span in spans for p in span], dtype=torch.int64, device=device),
            causal=torch.tensor([row.causal for row in parsed], dtype=torch.bool, device=device),
        )


def _short_cache(row: AttentionRow, kv_len: int, held: int, block_size: int) -> ValueError:
    return ValueError(
        f"row (request {row.request_id!r}, stream {row.stream!r}): kv_len {kv_len} but the cache holds "
        f"{held} blocks of {block_size}; append the step's tokens to the KV cache before building the batch"
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
