"""The CPU fast path of top-k/top-p (a topk prefix instead of a full sort) gives each row
exactly what the full sort gives, whichever path its batch takes."""

from __future__ import annotations

import pytest
import torch
from mstar.sampling import SamplingParams, SamplingTensors, kernel


def thresholds(probs, rows, prefix):
    st = SamplingTensors.from_rows(rows, seeds=[1] * len(rows), steps=[0] * len(rows))
    old = kernel._CPU_PREFIX
    kernel._CPU_PREFIX = prefix
    try:
        return kernel.keep_threshold(probs, st)
    finally:
        kernel._CPU_PREFIX = old


@pytest.mark.parametrize("seed", range(6))
def test_prefix_path_equals_full_sort(seed):
    g = torch.Generator().manual_seed(seed)
    vocab = 5000
    logits = torch.randn(12, vocab, generator=g) * float(torch.empty(()).uniform_(0.5, 6, generator=g))
    probs = torch.softmax(logits, dim=1)
    rows = []
    for i in range(12):
        kind = i % 5
        rows.append(SamplingParams(
            top_p=[0.3, 0.8, 0.95, 1.0, 0.9][kind],
            top_k=[-1, 50, -1, 3000, 2000][kind],
            min_p=0.0 if i % 3 else 0.01,
        ))
    full = thresholds(probs, rows, prefix=vocab + 1)  # prefix disabled: always the full sort
    for prefix in (64, 256, 1024):
        fast = thresholds(probs, rows, prefix=prefix)
        assert torch.equal(fast, full), prefix
    # Row by row (a batch that may take the other path) gives the same values.
    for i in range(12):
        assert torch.equal(thresholds(probs[i : i + 1], rows[i : i + 1], prefix=256), full[i : i + 1])


def test_prefix_path_is_taken_when_the_cutoff_fits(monkeypatch):
    calls = []
    real_sort = torch.sort
    monkeypatch.setattr(kernel.torch, "sort", lambda *a, **k: calls.append(1) or real_sort(*a, **k))
    probs = torch.softmax(torch.randn(4, 5000) * 8, dim=1)
    thresholds(probs, [SamplingParams(top_p=0.5)] * 4, prefix=1024)
    assert calls == []  # peaked distribution: the nucleus lies in the prefix
    thresholds(torch.full((1, 5000), 1 / 5000), [SamplingParams(top_p=0.9)], prefix=1024)
    assert calls == [1]  # flat: the nucleus needs 4500 tokens, so the full sort runs
