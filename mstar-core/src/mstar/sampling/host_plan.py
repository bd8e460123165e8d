"""What ``draw_cpu`` reads on the host about a batch's rows, read once per batch.

A sampler stages a batch's parameters once and then draws from it many times (a Qwen3-TTS
frame draws eight codebooks, a decode loop one token per step). Reading the parameters
back (``tolist``), sorting the rows by the kind of draw they need and mixing their seeds
cost about as much, for a handful of rows, as the small-vocabulary draw itself, and none
of it depends on the step. So it is done once per ``SamplingTensors`` object (and
vocabulary) and kept in the object's ``host`` slot, which its ``with_step`` copies share;
per draw only the step counters are read.

The plan is a function of the parameter tensors alone, so this changes no token: the
tensors must not be changed in place after the first draw (the sampler never does; it
stages fresh ones when a slot's parameters change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mstar.sampling.counter_rng import row_keys


@dataclass(frozen=True)
class RowGroup:
    """Rows of one kind of draw: their batch indices (``sel``: as a tensor, None when they
    are the whole batch, so the batch's own tensors serve), whether any divides by a
    temperature other than 1, the largest top_k among them, and the top_k every row
    shares (None when they differ)."""

    rows: list[int]
    sel: Tensor | None
    divide: bool
    max_k: int
    same_k: int | None


@dataclass(frozen=True)
class HostPlan:
    """Every row's kind (greedy, top_k alone over a small vocabulary, other filters, no
    filter) as groups, and the rows' mixed seeds for ``counter_rng.uniform_of_keys``."""

    keys: list[int]
    greedy: RowGroup | None
    top_k_only: RowGroup | None
    filtered: RowGroup | None
    plain: RowGroup | None

    @property
    def sampled(self) -> bool:
        return any(g is not None for g in (self.top_k_only, self.filtered, self.plain))


class HostPlanSlot:
    """A ``SamplingTensors``' cache of its plans, by what else a plan depends on."""

    __slots__ = ("plans",)

    def __init__(self) -> None:
        self.plans: dict[tuple[int, Callable[[int, int], bool]], HostPlan] = {}


def host_plan(
    temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, seed: Tensor,
    slot: HostPlanSlot, vocab: int, whole_row_first: Callable[[int, int], bool],
) -> HostPlan:
    """The batch's plan over a vocabulary of ``vocab`` ids; ``whole_row_first(vocab, max_k)``
    says whether rows with top_k alone skip the candidate levels (``draw.whole_row_first``)."""
    key = (vocab, whole_row_first)
    plan = slot.plans.get(key)
    if plan is None:
        plan = _plan(temperature, top_k, top_p, min_p, seed, vocab, whole_row_first)
        slot.plans[key] = plan
    return plan


def _plan(
    temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, seed: Tensor,
    vocab: int, whole_row_first: Callable[[int, int], bool],
) -> HostPlan:
    temps, ks, ps, mps = temperature.tolist(), top_k.tolist(), top_p.tolist(), min_p.tolist()
    batch = len(temps)
    greedy = [i for i in range(batch) if temps[i] == 0]
    sampled = [i for i in range(batch) if temps[i] != 0]
    filtered = [i for i in sampled if ks[i] > 0 or ps[i] < 1 or mps[i] > 0]
    plain = [i for i in sampled if ks[i] <= 0 and ps[i] >= 1 and mps[i] <= 0]
    top_k_only: list[int] = []
    if filtered and whole_row_first(vocab, max(ks[i] for i in filtered)):
        top_k_only = [i for i in filtered if ks[i] > 0 and ps[i] >= 1 and mps[i] <= 0]
        filtered = [i for i in filtered if not (ks[i] > 0 and ps[i] >= 1 and mps[i] <= 0)]

    def group(rows: list[int]) -> RowGroup | None:
        if not rows:
            return None
        sel = None if len(rows) == batch else torch.tensor(rows, dtype=torch.int64)
        row_ks = {ks[i] for i in rows}
        return RowGroup(rows, sel, any(temps[i] != 1 for i in rows), max(row_ks),
                        next(iter(row_ks)) if len(row_ks) == 1 else None)

    return HostPlan(row_keys(seed.tolist()) if sampled else [], group(greedy), group(top_k_only),
                    group(filtered), group(plain))
