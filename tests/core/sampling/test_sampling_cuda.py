"""On CUDA: the branch-free path draws what the CPU path draws, and SlotSampler
captures in a CUDA graph and replays to the eager result. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from mstar.sampling import SamplingParams, SamplingTensors, SlotSampler
from sampling_helpers import Sampler

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

V, B = 156_940, 32
KINDS = [
    dict(temperature=0.0),
    dict(top_k=50),
    dict(top_p=0.9),
    dict(top_k=40, top_p=0.8, min_p=0.01),
    dict(temperature=0.8),
]


def lm_like_logits() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, V, generator=gen) * 2.5
    hot = torch.randint(0, V, (B, 8), generator=gen)
    return x.scatter_add(1, hot, torch.rand(B, 8, generator=gen) * 12 + 6)


def test_cuda_draws_what_the_cpu_draws():
    x = lm_like_logits()
    rows = [SamplingParams(**KINDS[i % len(KINDS)]) for i in range(B)]
    agree = total = 0
    for step in range(20):
        st = SamplingTensors.from_rows(rows, list(range(B)), [step] * B)
        cpu = Sampler().sample(x, st).tokens
        st_cuda = SamplingTensors.from_rows(rows, list(range(B)), [step] * B, device="cuda")
        gpu = Sampler().sample(x.cuda(), st_cuda).tokens.cpu()
        greedy = torch.tensor([r.is_greedy for r in rows])
        assert torch.equal(cpu[greedy], gpu[greedy])
        agree += int((cpu == gpu).sum())
        total += B
    # exp/sum differ by an ulp between devices: a draw on a boundary may flip, rarely.
    assert agree >= 0.99 * total


def test_graph_capture_replays_the_eager_draw():
    x = lm_like_logits().cuda()
    sampler = SlotSampler(B, V, "cuda", preallocate_history=True)
    for i in range(B):
        sampler.add_request(i, SamplingParams(**KINDS[i % len(KINDS)]), seed=i)
    slots = torch.arange(B, device="cuda")
    hold = torch.zeros(B, dtype=torch.bool, device="cuda")  # do not advance: replayable
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        sampler.sample(x, slots, hold)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sampler.sample(x, slots, hold)
    graph.replay()
    torch.cuda.synchronize()
    eager = Sampler().sample(x, sampler.stage(slots)).tokens
    assert torch.equal(captured.tokens, eager)
