"""``mstar.sampling.compiled_region``: a region compiled whole draws through the batch's own
sampler, so it draws what the eager region draws, advances the same step counters, keeps
its draws in order, and needs a bound sampler."""

from __future__ import annotations

import pytest
import torch
from mstar.sampling.compiled_region import compile_region
from test_sampling_multi import make_sampler, resolved
from torch._dynamo.utils import counters

HIDDEN = 16


def _weights(vocab: int, seed: int) -> torch.Tensor:
    return torch.randn(HIDDEN, vocab, generator=torch.Generator().manual_seed(seed))


W_MAIN, W_TALKER, W_CODE = _weights(40, 1), _weights(24, 2), _weights(11, 3)
E_TALKER = torch.randn(24, HIDDEN, generator=torch.Generator().manual_seed(4))


def region(inputs: dict[str, torch.Tensor], sampler) -> dict[str, torch.Tensor]:
    """A main draw, then an aux draw fed back into the next aux draw, then two aux draws
    of one label from one set of logits (no data dependence orders those two)."""
    h = torch.tanh(inputs["h"])
    first = sampler.sample(h @ W_MAIN).tokens
    talker = sampler.sample_aux("talker", torch.sin(h) @ W_TALKER).tokens
    h2 = h + E_TALKER[talker]
    code = sampler.sample_aux("code", h2 @ W_CODE).tokens
    same = h2 @ W_TALKER
    a = sampler.sample_aux("talker", same).tokens
    b = sampler.sample_aux("talker", same).tokens
    return {"first": first, "talker": talker, "code": code, "a": a, "b": b}


def _bound(rows: int, seed: int):
    sampler = make_sampler(max_slots=8)
    for slot in range(rows):
        sampler.add_request(slot, resolved({"main": {"seed": seed + slot}, "aux": {"talker": {"seed": 100 + seed + slot}}}))
    return sampler, sampler.bind(torch.arange(rows))


def test_the_compiled_region_draws_what_the_eager_one_draws() -> None:
    compiled = compile_region(region)
    before = counters["stats"]["unique_graphs"]
    for rows, seed in [(1, 1), (3, 2), (5, 3), (1, 4)]:
        inputs = {"h": torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(seed))}
        eager_sampler, eager_batch = _bound(rows, seed)
        comp_sampler, comp_batch = _bound(rows, seed)
        for _ in range(3):  # consecutive steps: the counters move on alike
            want = region(inputs, eager_batch)
            got = compiled(inputs, comp_batch)
            assert got.keys() == want.keys()
            for name in want:
                assert torch.equal(got[name], want[name]), (rows, name)
        for label, s in eager_sampler.samplers.items():
            assert torch.equal(comp_sampler.samplers[label].step_counters, s.step_counters), label
    assert counters["stats"]["unique_graphs"] - before >= 2  # one row, then several
    assert not counters["graph_break"], dict(counters["graph_break"])


class _Order:
    """A sampler that records its draws and numbers them per label (1, 2, ...)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def sample(self, logits: torch.Tensor):
        return self.sample_aux("main", logits)

    def sample_aux(self, label: str, logits: torch.Tensor):
        self.calls.append(label)
        return _Tokens(torch.full((logits.shape[0],), self.calls.count(label), dtype=torch.int64))


class _Tokens:
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens


def test_draws_of_a_label_keep_their_order_and_none_is_dropped() -> None:
    """``a`` and ``b`` share their logits: only the per-label chain orders them. The last
    draw's tokens are unused: it still runs. (Draws of different labels may run in any
    order: each label has its own step counters.)"""

    def unused_draw(inputs, sampler):
        out = region(inputs, sampler)
        sampler.sample_aux("code", inputs["h"] @ W_CODE)  # result unused
        return out

    compiled = compile_region(unused_draw)
    order = _Order()
    got = compiled({"h": torch.randn(2, HIDDEN)}, order)
    assert sorted(order.calls) == sorted(["main", "talker", "code", "talker", "talker", "code"])
    assert [got[k].tolist() for k in ("first", "talker", "code", "a", "b")] == [[1, 1], [1, 1], [1, 1], [2, 2], [3, 3]]


def test_a_draw_without_a_bound_sampler_says_so() -> None:
    with pytest.raises(RuntimeError, match="no sampler bound"):
        torch.ops.mstar.draw_aux(torch.randn(2, 5), "code", None)
