"""Rows with top_k alone over a small vocabulary (a TTS codebook: 256-3072 ids) take a
topk of the row instead of the full sort: they must draw exactly what the full-sort path,
the graph-safe path and the independent reference draw, alone or in any batch."""

from __future__ import annotations

import pytest
import torch
from mstar.sampling import SamplingParams, SamplingTensors, draw
from sampling_helpers import Sampler
from test_sampling_fast_paths import check_alone_and_reference, logits_of

PARAMS = [
    dict(temperature=0.9, top_k=50), dict(temperature=1.0, top_k=50), dict(temperature=0.7, top_k=1),
    dict(temperature=1.3, top_k=5000), dict(temperature=0.9, top_k=3), dict(temperature=0.0),
    dict(temperature=0.9, top_k=50, top_p=0.8), dict(temperature=1.0, top_k=20, min_p=0.05),
    dict(temperature=0.9), dict(temperature=1.0, top_p=0.9),
]


def suppressed_logits(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """The talker's shape: -inf on the last ids (suppressed), fewer left than some top_k."""
    x = torch.randn(rows, vocab, generator=gen) * 3
    x[:, vocab // 8 :] = float("-inf")
    return x


def full_sort_tokens(monkeypatch, x: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """The tokens of the path before the topk one (every filtered row through the levels)."""
    with monkeypatch.context() as m:
        m.setattr(draw, "whole_row_first", lambda vocab, max_k: False)
        return draw.draw_cpu(x, st)


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "suppressed"])
@pytest.mark.parametrize("vocab", [64, 256, 2048, 3072])
def test_top_k_rows_draw_what_the_full_sort_and_the_reference_draw(monkeypatch, kind, vocab):
    gen = torch.Generator().manual_seed(vocab + len(kind))
    rows = [SamplingParams(**p) for p in PARAMS] * 3
    x = suppressed_logits(len(rows), vocab, gen) if kind == "suppressed" else logits_of(kind, len(rows), vocab, gen)
    seeds, steps = [7 << 20 | i for i in range(len(rows))], [i * 5 for i in range(len(rows))]
    st = SamplingTensors.from_rows(rows, seeds, steps)
    calls: list[int] = []
    real = draw._draw_top_k
    monkeypatch.setattr(draw, "_draw_top_k", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    batch = Sampler().sample(x, st).tokens
    assert calls == [15]  # the top_k-only rows, in one call
    assert torch.equal(batch, full_sort_tokens(monkeypatch, x, st))
    assert calls == [15]  # the full-sort path took none (the host plan is not reused for it)
    assert torch.equal(batch, draw.draw_branch_free(x, st))
    assert check_alone_and_reference(x, rows, seeds, steps, batch) >= 0.8 * len(rows)


@pytest.mark.parametrize("k", [1, 50, 255, 256, 5000])
@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "suppressed"])
def test_rows_sharing_one_top_k_draw_what_the_full_sort_and_the_reference_draw(monkeypatch, kind, k):
    """A batch whose rows all use one top_k (a codebook sampler's usual batch) reads its cut
    as one column of the topk; the tokens are those of the full sort and the reference, at
    several steps of one staged batch (``with_step`` copies share its host plan)."""
    vocab = 256
    gen = torch.Generator().manual_seed(k + len(kind))
    rows = [SamplingParams(temperature=t, top_k=k) for t in (0.9, 1.0, 0.7, 1.3)] * 3
    x = suppressed_logits(len(rows), vocab, gen) if kind == "suppressed" else logits_of(kind, len(rows), vocab, gen)
    seeds = [11 << 30 | i for i in range(len(rows))]
    staged = SamplingTensors.from_rows(rows, seeds, [0] * len(rows))
    for step in (0, 3, 17):
        steps = [step + i for i in range(len(rows))]
        st = staged.with_step(torch.tensor(steps))
        batch = Sampler().sample(x, st).tokens
        fresh = SamplingTensors.from_rows(rows, seeds, steps)
        assert torch.equal(batch, full_sort_tokens(monkeypatch, x, fresh))
        assert torch.equal(batch, draw.draw_branch_free(x, fresh))
        assert check_alone_and_reference(x, rows, seeds, steps, batch) >= 0.8 * len(rows)


def test_large_vocabularies_keep_the_candidate_levels(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(draw, "_draw_top_k", lambda x, *a: calls.append(1))
    gen = torch.Generator().manual_seed(0)
    rows = [SamplingParams(top_k=50)] * 2
    st = SamplingTensors.from_rows(rows, [1, 2], [0, 0])
    Sampler().sample(logits_of("peaked", 2, 40_000, gen), st)
    assert calls == []
