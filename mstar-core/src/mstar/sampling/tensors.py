"""Batch-level tensor containers: per-row parameters in, sampled tokens out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mstar.sampling.host_plan import HostPlanSlot
from mstar.sampling.params import SamplingParams


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling parameters of one batch, already on the sampling device.

    Float parameters that only scale logits are float32 (the logits' precision);
    ``top_p``/``min_p`` are float64 because they are compared against float64
    cumulative sums. ``needs_sort``, ``any_sampled``, ``any_logprobs`` and
    ``max_top_logprobs`` are host-side hints that only select work to skip (True / a
    larger value is always safe); they never change which token is drawn. Without
    ``any_logprobs`` the output's logprobs are NaN.
    """

    temperature: Tensor  # float32 [B]; 0 = greedy
    top_k: Tensor  # int64 [B]; <= 0 = disabled
    top_p: Tensor  # float64 [B]
    min_p: Tensor  # float64 [B]
    repetition_penalty: Tensor  # float32 [B]
    presence_penalty: Tensor  # float32 [B]
    frequency_penalty: Tensor  # float32 [B]
    seed: Tensor  # int64 [B]
    step: Tensor  # int64 [B]; index into the row's random stream
    min_tokens: Tensor  # int64 [B]
    num_generated: Tensor  # int64 [B]; stop ids are suppressed while < min_tokens
    logprobs: Tensor  # bool [B]; whether the row's caller wants logprobs
    top_logprobs: Tensor  # int64 [B]
    needs_sort: bool = True
    max_top_logprobs: int = 0
    any_sampled: bool = True
    any_logprobs: bool = True
    # The CPU draw's host-side reading of the parameters (``mstar.sampling.host_plan``),
    # made on the first draw and shared with ``with_step`` copies.
    host: HostPlanSlot = field(default_factory=HostPlanSlot, compare=False, repr=False)

    @property
    def batch_size(self) -> int:
        return self.temperature.shape[0]

    def with_step(self, step: Tensor) -> SamplingTensors:
        """The same rows at ``step`` (also their ``num_generated``: one draw per token),
        sharing every other tensor and the host plan. A shallow copy of the fields: a
        sampler makes one per draw, where ``dataclasses.replace`` costs ~10x more."""
        new = object.__new__(SamplingTensors)
        new.__dict__.update(self.__dict__, step=step, num_generated=step)
        return new

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[SamplingParams],
        seeds: Sequence[int] | None,
        steps: Sequence[int],
        device: torch.device | str = "cpu",
        num_generated: Sequence[int] | None = None,
    ) -> SamplingTensors:
        """Build the batch from per-row params.

        ``seeds`` defaults to each row's own ``seed`` (which must then be set);
        ``num_generated`` defaults to ``steps`` (one draw per generated token).
        """
        if seeds is None:
            if any(r.seed is None for r in rows):
                raise ValueError("a row has no seed; resolve seeds before sampling")
            seeds = [r.seed for r in rows]  # type: ignore[misc]
        if len(seeds) != len(rows) or len(steps) != len(rows):
            raise ValueError("rows, seeds and steps must have the same length")
        if num_generated is None:
            num_generated = steps

        def t(values: Iterable[object], dtype: torch.dtype) -> Tensor:
            return torch.tensor(list(values), dtype=dtype, device=device)

        return cls(
            temperature=t((r.temperature for r in rows), torch.float32),
            top_k=t((r.top_k for r in rows), torch.int64),
            top_p=t((r.top_p for r in rows), torch.float64),
            min_p=t((r.min_p for r in rows), torch.float64),
            repetition_penalty=t((r.repetition_penalty for r in rows), torch.float32),
            presence_penalty=t((r.presence_penalty for r in rows), torch.float32),
            frequency_penalty=t((r.frequency_penalty for r in rows), torch.float32),
            seed=t(seeds, torch.int64),
            step=t(steps, torch.int64),
            min_tokens=t((r.min_tokens for r in rows), torch.int64),
            num_generated=t(num_generated, torch.int64),
            logprobs=t((r.logprobs for r in rows), torch.bool),
            top_logprobs=t((r.top_logprobs for r in rows), torch.int64),
            needs_sort=any(r.uses_top_k_or_p for r in rows),
            max_top_logprobs=max((r.top_logprobs for r in rows), default=0),
            any_sampled=any(not r.is_greedy for r in rows),
            any_logprobs=any(r.logprobs for r in rows),
        )


@dataclass(frozen=True)
class SeenTokens:
    """The (row, token) pairs of a batch that penalties act on (prompt and output tokens
    of rows with penalties), each with its output count: the sparse form of
    ``output_counts`` and ``prompt_mask``, for a caller that already knows them."""

    rows: Tensor  # int64 [N]
    cols: Tensor  # int64 [N]
    counts: Tensor  # int32 [N]


@dataclass(frozen=True)
class SampleOutput:
    """Result of one sampling call.

    ``logprobs`` are "raw" logprobs (vLLM's default): log_softmax of the logits
    after penalties and min_tokens suppression, before temperature and
    top-k/top-p/min-p; NaN when no row of the call asked for logprobs. ``top_logprob_*`` are sorted descending, width N = the
    largest ``top_logprobs`` requested (None when nobody asked); rows that
    asked for fewer use a prefix.
    """

    tokens: Tensor  # int64 [B]
    logprobs: Tensor  # float32 [B]
    top_logprob_ids: Tensor | None = None  # int64 [B, N]
    top_logprob_values: Tensor | None = None  # float32 [B, N]


def _rows_to_mask(
    ids_per_row: Sequence[Iterable[int]], vocab_size: int, device: torch.device | str
) -> tuple[Tensor, Tensor, Tensor]:
    """(row index, token id) pairs for scatter, built once on the host."""
    rows: list[int] = []
    cols: list[int] = []
    for i, ids in enumerate(ids_per_row):
        for tok in ids:
            tok = int(tok)
            if not 0 <= tok < vocab_size:
                raise ValueError(f"token id {tok} out of range for vocab size {vocab_size}")
            rows.append(i)
            cols.append(tok)
    r = torch.tensor(rows, dtype=torch.int64, device=device)
    c = torch.tensor(cols, dtype=torch.int64, device=device)
    return r, c, torch.ones(len(rows), dtype=torch.int32, device=device)


def token_mask(
    ids_per_row: Sequence[Iterable[int]], vocab_size: int, device: torch.device | str = "cpu"
) -> Tensor:
    """bool [B, V]: True where the row's id list contains the token (prompt or stop ids)."""
    mask = torch.zeros(len(ids_per_row), vocab_size, dtype=torch.bool, device=device)
    r, c, _ = _rows_to_mask(ids_per_row, vocab_size, device)
    mask[r, c] = True
    return mask


def token_counts(
    ids_per_row: Sequence[Iterable[int]], vocab_size: int, device: torch.device | str = "cpu"
) -> Tensor:
    """int32 [B, V]: how often each token occurs in the row's id list (output history)."""
    counts = torch.zeros(len(ids_per_row), vocab_size, dtype=torch.int32, device=device)
    r, c, ones = _rows_to_mask(ids_per_row, vocab_size, device)
    counts.index_put_((r, c), ones, accumulate=True)
    return counts
