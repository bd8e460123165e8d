"""The CPU draw over the kept set only: top_p's cut from bounds on the vocabulary mass,
min_p rows on candidate levels, and a draw that never orders or sums the dropped
candidates. Every path must draw exactly the token the independent full-sort reference
draws, and what the whole-vocabulary (graph-safe) path draws."""

from __future__ import annotations

import pytest
import torch
from mstar.sampling import SamplingParams, SamplingTensors, draw
from mstar.sampling.vocab_groups import VocabGroups
from sampling_helpers import Sampler
from test_sampling_fast_paths import check_against_reference, check_alone_and_reference, logits_of

VOCAB = 40_000  # large enough for group levels (64 groups of 16 <= vocab / 32)


def lm_logits(rows: int, vocab: int, gen: torch.Generator, spread: float = 2.5) -> torch.Tensor:
    """The benchmark's shape: an N(0, spread^2) background, eight tokens boosted by 12 to 24."""
    x = torch.randn(rows, vocab, generator=gen) * spread
    hot = torch.randint(0, vocab, (rows, 8), generator=gen)
    return x.scatter_add(1, hot, torch.rand(rows, 8, generator=gen) * 12 + 12)


def masked_logits(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Only a slice of the vocabulary is allowed (-inf elsewhere), as a model that
    restricts its output to a token range does: top_k beyond the slice keeps zero weights."""
    x = torch.full((rows, vocab), float("-inf"))
    x[:, 1000:1030] = torch.randn(rows, 30, generator=gen) * 3
    return x


def call_sizes(monkeypatch, name: str) -> list[int]:
    """Record the number of rows each call of ``draw.<name>`` gets."""
    sizes: list[int] = []
    real = getattr(draw, name)

    def spy(x, *a, **k):
        sizes.append(x.shape[0])
        return real(x, *a, **k)

    monkeypatch.setattr(draw, name, spy)
    return sizes


def test_mass_bounds_hold_the_exact_mass():
    gen = torch.Generator().manual_seed(0)
    for x, temperature in (
        (lm_logits(6, VOCAB, gen), 1.0),
        (logits_of("peaked", 6, VOCAB, gen), 0.7),
        (logits_of("flat", 6, VOCAB, gen), 1.3),
        (logits_of("ties", 6, VOCAB, gen), 1.0),
        (masked_logits(6, VOCAB, gen), 1.0),
    ):
        st = SamplingTensors.from_rows([SamplingParams(temperature=temperature, top_p=0.9)] * 6, [0] * 6, [0] * 6)
        rows = draw._Rows.of(st, st.temperature)
        groups = VocabGroups.of(x)
        for num in (1, 64, 500):
            top = groups.top_groups(num)
            ids = groups.ids_of(top)
            d = draw._scaled(x.gather(1, ids), groups.row_max, rows.temperature, True)
            bounds = draw._mass_bounds(d, draw._outside_maxima(groups, top, rows, True))
            exact = draw.total_mass(x, groups.row_max, rows.temperature, True)
            assert bool((bounds.lo <= exact).all()) and bool((exact <= bounds.hi).all())


def test_peaked_top_p_rows_skip_the_full_mass_and_draw_what_the_reference_draws(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    rows = [SamplingParams(top_p=0.9), SamplingParams(top_p=0.5, temperature=0.8),
            SamplingParams(top_p=0.95, min_p=0.01)] * 8
    x = lm_logits(len(rows), VOCAB, gen)
    seeds, steps = [50 + i for i in range(len(rows))], [i % 5 for i in range(len(rows))]
    masses = call_sizes(monkeypatch, "total_mass")
    assert check_against_reference(x, rows, seeds, steps) >= 0.9 * len(rows)
    # The group maxima settle the cut of most rows; the rest sum their own rows only.
    assert sum(masses) <= len(rows) // 4


def test_rows_the_bounds_leave_open_sum_the_mass_and_draw_the_same(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    rows = [SamplingParams(top_p=p, temperature=t) for p in (0.3, 0.9, 0.99) for t in (0.7, 1.0)] * 3
    x = lm_logits(len(rows), VOCAB, gen, spread=1.5)
    st = SamplingTensors.from_rows(rows, list(range(len(rows))), [7] * len(rows))
    default = Sampler().sample(x, st).tokens
    masses = call_sizes(monkeypatch, "total_mass")
    monkeypatch.setattr(draw, "_SUM_SLACK", 0.5)  # bounds too loose for most cuts
    assert torch.equal(Sampler().sample(x, st).tokens, default)
    # One exact sum over the rows the bounds left open (rows keeping one token settle).
    assert len(masses) == 1 and masses[0] >= len(rows) // 2
    assert torch.equal(draw.draw_branch_free(x, st), default)
    assert check_against_reference(x, rows, list(range(len(rows))), [7] * len(rows)) >= 0.9 * len(rows)


def test_open_bounds_never_move_the_cut(monkeypatch):
    # Weights 1, .9, .8, .7 and top_p 0.5: the nucleus is the first two. A mass bound 50%
    # high would take three, and a third of the draws would land on the third token.
    rows = [SamplingParams(top_p=0.5)] * 48
    x = torch.full((len(rows), VOCAB), -30.0)
    x[:, [7, 9000, 20_000, 39_999]] = torch.tensor([1.0, 0.9, 0.8, 0.7]).log()
    seeds, steps = [1000 + i for i in range(len(rows))], [0] * len(rows)
    monkeypatch.setattr(draw, "_SUM_SLACK", 0.5)
    st = SamplingTensors.from_rows(rows, seeds, steps)
    tokens = Sampler().sample(x, st).tokens
    assert set(tokens.tolist()) == {7, 9000}
    assert check_against_reference(x, rows, seeds, steps) == len(rows)


def test_min_p_rows_use_candidate_levels(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    rows = [SamplingParams(min_p=0.05), SamplingParams(min_p=0.2, temperature=1.5),
            SamplingParams(min_p=0.001, temperature=0.6)] * 4
    x = logits_of("peaked", len(rows), VOCAB, gen)
    seeds, steps = list(range(len(rows))), [1] * len(rows)
    full = call_sizes(monkeypatch, "_draw_full")
    assert check_against_reference(x, rows, seeds, steps) >= 0.9 * len(rows)
    assert full == []  # peaked rows: the first candidate level holds every w >= min_p
    # A flat row keeps most of the vocabulary: it must reach the whole-vocabulary level.
    flat = logits_of("flat", len(rows), VOCAB, gen)
    # (40k near-equal weights: the reference calls more draws too close to call)
    assert check_against_reference(flat, rows, seeds, steps) >= len(rows) // 2
    assert full and full[-1] >= 1


def test_a_top_p_nucleus_beyond_the_groups_grows_to_a_topk_level(monkeypatch):
    # ~1.5k tokens share the mass: more than the first group levels hold, fewer than the
    # first topk level (4096): no full sort, and the reference's token.
    gen = torch.Generator().manual_seed(4)
    rows = [SamplingParams(top_p=0.9), SamplingParams(top_k=3000, top_p=0.8)] * 3
    x = torch.randn(len(rows), VOCAB, generator=gen) * 0.3 - 20
    x[:, :1500] += 20
    kinds: list[str] = []
    real = draw._candidates

    def spy(groups, kind, num):
        kinds.append(kind)
        return real(groups, kind, num)

    monkeypatch.setattr(draw, "_candidates", spy)
    full = call_sizes(monkeypatch, "_draw_full")
    seeds, steps = [9] * len(rows), list(range(len(rows)))
    assert check_against_reference(x, rows, seeds, steps) >= 0.9 * len(rows)
    assert "top" in kinds and full == []


@pytest.mark.parametrize("kind", ["lm", "peaked", "flat", "ties", "masked"])
def test_mixed_batch_equals_rows_alone_equals_reference_equals_branch_free(kind):
    gen = torch.Generator().manual_seed(len(kind))
    params = [
        dict(temperature=0.0), dict(top_k=50), dict(top_p=0.9), dict(top_k=50, top_p=0.9),
        dict(min_p=0.05), dict(temperature=0.8, top_k=2000, top_p=0.95, min_p=0.01),
        dict(temperature=1.2), dict(top_k=1), dict(temperature=0.0),
    ]
    rows = [SamplingParams(**p) for p in params] * 2
    make = {"lm": lm_logits, "masked": masked_logits}.get(kind)
    x = make(len(rows), VOCAB, gen) if make else logits_of(kind, len(rows), VOCAB, gen)
    seeds, steps = [1 << 33 | i for i in range(len(rows))], [i * 3 for i in range(len(rows))]
    st = SamplingTensors.from_rows(rows, seeds, steps)
    batch = Sampler().sample(x, st).tokens
    assert torch.equal(draw.draw_branch_free(x, st), batch)
    assert check_alone_and_reference(x, rows, seeds, steps, batch) >= 0.8 * len(rows)
    if kind == "masked":  # every draw lands inside the allowed slice
        assert bool(((batch >= 1000) & (batch < 1030)).all())


@pytest.mark.parametrize("quantised", [False, True])
def test_top_groups_through_super_groups_are_the_top_groups(quantised):
    # 2,500 groups of 16 (and a tail): the super-group pick runs for small counts; with
    # quantised logits many maxima tie at the bound, and any tied group may be taken.
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, VOCAB + 9, generator=gen)
    if quantised:
        x = (x * 2).round()
    groups = VocabGroups.of(x)
    assert torch.equal(groups.row_max.squeeze(1), x.amax(dim=1))
    for num in (1, 4, 64, 200, 2000):
        top = groups.top_groups(num)
        want = torch.topk(groups.group_max, num, dim=1).values
        assert torch.equal(top.values.sort(dim=1, descending=True).values, want)
        assert torch.equal(groups.group_max.gather(1, top.indices), top.values)
        ids, bound = groups.candidates(num)
        for r in range(4):
            inside = set(ids[r].tolist())
            assert len(inside) == ids.shape[1]
            assert set((x[r] > bound[r]).nonzero().squeeze(1).tolist()) <= inside


def test_host_inverse_cdf_falls_back_to_the_last_positive_weight():
    # u = 1 puts the target at the total: the search ends past the last positive weight.
    gen = torch.Generator().manual_seed(6)
    w = torch.rand(5, 300, generator=gen) * (torch.rand(5, 300, generator=gen) < 0.2)
    w[:, 250:] = 0.0
    u = torch.tensor([0.0, 0.3, 0.999, 1.0, 1.0], dtype=torch.float64)
    sync_free = draw.inverse_cdf(w, u)
    assert torch.equal(draw.inverse_cdf(w, u, host=True), sync_free)
    last = [int(row.nonzero().max()) for row in w]
    assert sync_free[3:].tolist() == last[3:]
    assert bool((w.gather(1, sync_free.unsqueeze(1)) > 0).all())
