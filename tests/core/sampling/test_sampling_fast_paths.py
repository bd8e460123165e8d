"""The CPU fast paths (argmax from group maxima, top-k/top-p over a growing candidate set)
draw exactly the token an independent full-sort reference draws, on every path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mstar.sampling import SamplingParams, SamplingTensors, draw
from mstar.sampling.vocab_groups import VocabGroups
from sampling_helpers import Sampler
from sampling_reference import Ambiguous, reference_draw

PARAMS = [
    dict(temperature=0.0),
    dict(temperature=1.0, top_k=1),
    dict(temperature=1.0, top_k=50),
    dict(temperature=0.7, top_k=50),
    dict(temperature=1.3, top_k=700),
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=0.8, top_p=0.3),
    dict(temperature=1.0, top_p=0.99),
    dict(temperature=1.0, top_k=40, top_p=0.8),
    dict(temperature=1.2, top_k=300, top_p=0.95, min_p=0.02),
    dict(temperature=1.0, top_p=0.9, min_p=0.1),
    dict(temperature=0.9),
    dict(temperature=1.0, min_p=0.05),
]


def logits_of(kind: str, rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "peaked":  # an LM-like distribution: a few dominant tokens, a long tail
        x = torch.randn(rows, vocab, generator=gen) * 2.0
        hot = torch.randint(0, vocab, (rows, 8), generator=gen)
        return x.scatter_add(1, hot, torch.rand(rows, 8, generator=gen) * 12 + 6)
    if kind == "flat":  # the nucleus spans most of the vocabulary: the fallback path
        return torch.randn(rows, vocab, generator=gen) * 0.05
    if kind == "ties":  # quantised logits: ties at the maximum and at every cut
        return torch.randint(0, 6, (rows, vocab), generator=gen).float()
    raise ValueError(kind)


def check_against_reference(logits: torch.Tensor, rows: list[SamplingParams], seeds, steps) -> int:
    st = SamplingTensors.from_rows(rows, seeds, steps)
    got = Sampler().sample(logits, st).tokens.tolist()
    compared = 0
    for i, p in enumerate(rows):
        try:
            want = reference_draw(
                logits[i].numpy(), p.temperature, p.top_k, p.top_p, p.min_p, seeds[i], steps[i]
            )
        except Ambiguous:
            continue
        assert got[i] == want, (i, p)
        compared += 1
    return compared


def check_alone_and_reference(logits: torch.Tensor, rows: list[SamplingParams], seeds, steps, batch: torch.Tensor) -> int:
    """Each row sampled alone draws what it drew in ``batch``, and what the reference draws
    (rows whose reference draw is ambiguous are skipped); returns how many were compared."""
    compared = 0
    for i, p in enumerate(rows):
        one = SamplingTensors.from_rows([p], seeds[i : i + 1], steps[i : i + 1])
        assert Sampler().sample(logits[i : i + 1], one).tokens.item() == batch[i].item()
        try:
            want = reference_draw(logits[i].numpy(), p.temperature, p.top_k, p.top_p, p.min_p, seeds[i], steps[i])
        except Ambiguous:
            continue
        assert batch[i].item() == want, (i, p)
        compared += 1
    return compared


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties"])
@pytest.mark.parametrize("vocab", [1000, 20_011])
def test_fast_paths_draw_what_the_reference_draws(kind, vocab):
    gen = torch.Generator().manual_seed(vocab + len(kind))
    rows = [SamplingParams(**p) for p in PARAMS] * 3
    logits = logits_of(kind, len(rows), vocab, gen)
    seeds = [1000 + i for i in range(len(rows))]
    steps = [i % 7 for i in range(len(rows))]
    compared = check_against_reference(logits, rows, seeds, steps)
    assert compared >= 0.9 * len(rows)  # ambiguous rows (float boundaries) stay rare
    # The same rows one at a time draw the same tokens (a batch of one takes other paths).
    st = SamplingTensors.from_rows(rows, seeds, steps)
    batch = Sampler().sample(logits, st).tokens
    for i in range(0, len(rows), 5):
        one = SamplingTensors.from_rows(rows[i : i + 1], seeds[i : i + 1], steps[i : i + 1])
        assert Sampler().sample(logits[i : i + 1], one).tokens.item() == batch[i].item()


@pytest.mark.parametrize("first", [1, 4, 16])
def test_every_growth_level_draws_the_same(monkeypatch, first):
    # Small first levels force the real schedule through several group and topk levels.
    gen = torch.Generator().manual_seed(first)
    kinds = [dict(top_p=0.9), dict(top_p=0.3, temperature=0.8), dict(top_p=0.99), dict(top_k=1),
             dict(top_k=3, top_p=0.8), dict(top_p=0.95, min_p=0.02, temperature=1.2)]
    rows = [SamplingParams(**k) for k in kinds] * 3
    logits = logits_of("peaked", len(rows), 20_011, gen)
    seeds, steps = list(range(len(rows))), [3] * len(rows)
    st = SamplingTensors.from_rows(rows, seeds, steps)
    default = Sampler().sample(logits, st).tokens
    monkeypatch.setattr(draw, "_FIRST_GROUPS", first)
    monkeypatch.setattr(draw, "_FIRST_WIDTH", 16 * first)
    monkeypatch.setattr(draw, "_GROWTH", 2)
    levels = list(draw._levels(20_011, 3))
    assert {"groups", "top", "all"} == {kind for kind, _ in levels} and len(levels) >= 7
    assert torch.equal(Sampler().sample(logits, st).tokens, default)
    assert check_against_reference(logits, rows, seeds, steps) >= 0.9 * len(rows)


def test_every_candidate_count_draws_what_the_reference_draws(monkeypatch):
    # Levels of 1, 2, 3, ... groups: every relation between k, the nucleus and the
    # candidates' bound occurs on some level; the result must never change.
    def every_level(vocab, max_k):
        for num in range(1, 40):
            yield "groups", num
        yield "all", vocab

    monkeypatch.setattr(draw, "_levels", every_level)
    gen = torch.Generator().manual_seed(11)
    rows = [SamplingParams(top_k=k, top_p=p) for k in (2, 5, 12, 30) for p in (0.5, 0.8, 1.0)] * 2
    seeds, steps = list(range(len(rows))), [0] * len(rows)
    for logits in (
        torch.randn(len(rows), 700, generator=gen) * 1.5,
        torch.randint(0, 40, (len(rows), 700), generator=gen).float() / 4,  # ties at every bound
    ):
        assert check_against_reference(logits, rows, seeds, steps) >= 0.9 * len(rows)


def test_branch_free_path_draws_the_same_tokens():
    # The graph-safe path (used off the CPU) run here on the CPU: same tokens per row.
    gen = torch.Generator().manual_seed(5)
    rows = [SamplingParams(**p) for p in PARAMS] * 2
    for kind in ("peaked", "ties"):
        logits = logits_of(kind, len(rows), 3000, gen)
        st = SamplingTensors.from_rows(rows, list(range(len(rows))), [1] * len(rows))
        assert torch.equal(draw.draw_branch_free(logits, st), draw.draw_cpu(logits, st))


def test_peaked_rows_never_sort_the_vocabulary_and_flat_ones_fall_back(monkeypatch):
    sorted_widths: list[int] = []
    real_sort = torch.sort

    def spy(t, *a, **k):
        sorted_widths.append(t.shape[-1])
        return real_sort(t, *a, **k)

    monkeypatch.setattr(draw.torch, "sort", spy)
    vocab = 40_000  # large enough for the group levels (64 groups of 16 <= vocab / 32)
    gen = torch.Generator().manual_seed(0)
    rows = [SamplingParams(top_p=0.9), SamplingParams(top_k=50), SamplingParams(temperature=0)]
    seeds, steps = [1, 2, 3], [0, 0, 0]
    st = SamplingTensors.from_rows(rows, seeds, steps)
    peaked = logits_of("peaked", 3, vocab, gen)
    Sampler().sample(peaked, st)
    # Only vocabulary-order sorts of the first level's ~1k candidates ran.
    assert sorted_widths and max(sorted_widths) <= 64 * 16 + 15
    assert check_against_reference(peaked, rows, seeds, steps) == 3
    sorted_widths.clear()
    Sampler().sample(logits_of("flat", 3, vocab, gen), st)
    assert max(sorted_widths) == vocab  # a flat top_p 0.9 nucleus needs the whole vocabulary


def test_greedy_is_first_index_of_the_maximum_with_ties_across_groups():
    x = torch.zeros(3, 1000)
    x[0, [999, 17, 500]] = 5.0  # tied in three groups: the first index wins
    x[1, :] = 1.0  # all tied
    x[2, 998] = float("nan")  # NaN counts as the maximum, as in torch.argmax
    st = SamplingTensors.from_rows([SamplingParams(temperature=0)] * 3, [0] * 3, [0] * 3)
    assert Sampler().sample(x, st).tokens.tolist() == [17, 0, 998]


def test_group_candidates_hold_every_id_above_the_bound():
    gen = torch.Generator().manual_seed(1)
    for vocab in (16, 1000, 1013):
        x = torch.randint(0, 50, (4, vocab), generator=gen).float()
        groups = VocabGroups.of(x)
        assert torch.equal(groups.row_max.squeeze(1), x.amax(dim=1))
        for num in (1, 3, 10):
            ids, bound = groups.candidates(num)
            if ids is None:
                assert num >= groups.num_groups
                continue
            for r in range(4):
                inside = set(ids[r].tolist())
                assert len(inside) == ids.shape[1]  # no id twice
                above = set((x[r] > bound[r]).nonzero().squeeze(1).tolist())
                assert above <= inside


def test_total_mass_does_not_depend_on_the_batch():
    # A plain row sum is split across threads differently for one row than for many.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(2)
        x = torch.randn(8, 156_940, generator=gen) * 3
        m = x.amax(dim=1, keepdim=True)
        t = torch.full((8, 1), 0.7)
        batch = draw.total_mass(x, m, t, True)
        for i in range(8):
            one = draw.total_mass(x[i : i + 1], m[i : i + 1], t[i : i + 1], True)
            assert torch.equal(one, batch[i : i + 1])
        w = ((x - m) / t).exp()
        ref = np.exp(((x - m) / t).double().numpy()).sum(axis=1)
        assert np.allclose(batch.squeeze(1).numpy(), ref, rtol=1e-6)
        assert torch.allclose(batch.squeeze(1), w.double().sum(dim=1), rtol=1e-6)
    finally:
        torch.set_num_threads(threads)


def test_ties_across_the_edge_of_a_topk_level_are_all_kept():
    # Six logit values ~3.3k times each: the 4096 largest end inside the run of 4s, so a
    # cut at 4 keeps 4s the topk level left out, and only the whole vocabulary holds them.
    gen = torch.Generator().manual_seed(3)
    rows = [SamplingParams(top_k=4000), SamplingParams(top_k=3500, top_p=0.99)] * 4
    logits = torch.randint(0, 6, (len(rows), 20_011), generator=gen).float() * 0.2
    seeds, steps = list(range(len(rows))), [0] * len(rows)
    assert check_against_reference(logits, rows, seeds, steps) == len(rows)


@pytest.mark.parametrize("shape", [(3, 1000), (40, 20_011)], ids=["one-argmax", "grouped"])
def test_greedy_takes_the_first_maximum_on_both_paths(shape):
    """Greedy rows take one argmax while the batch's logits are few (``draw.ARGMAX_ELEMENTS``)
    and the grouped search above that: both the first index of each row's maximum, ties
    included."""
    rows, vocab = shape
    assert (rows * vocab > draw.ARGMAX_ELEMENTS) == (shape[0] == 40)
    logits = logits_of("ties", rows, vocab, torch.Generator().manual_seed(rows))
    greedy = [SamplingParams(temperature=0.0)] * rows
    got = Sampler().sample(logits, SamplingTensors.from_rows(greedy, [0] * rows, [0] * rows)).tokens.tolist()
    assert got == [int(np.argmax(row)) for row in logits.numpy()]  # numpy: the first maximum
