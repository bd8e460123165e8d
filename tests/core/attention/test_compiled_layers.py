"""``mstar.attention.compiled_layers``: a layer stack compiled whole, its attention through the
step's real backend, computes what the eager stack does (outputs and the KV cache it
writes) over prefill and decode steps, and needs a bound backend."""

from __future__ import annotations

import pytest
import torch
from mstar.attention import AttentionBatch, TorchAttentionBackend
from mstar.attention.compiled_layers import compile_with_attention
from mstar.kv import KVCacheManager
from torch._dynamo.utils import counters

LAYERS, HQ, HKV, DIM = 3, 4, 2, 8
WIDTH = HQ * DIM
_gen = torch.Generator().manual_seed(0)
WQ = [torch.randn(WIDTH, HQ * DIM, generator=_gen) / 4 for _ in range(LAYERS)]
WK = [torch.randn(WIDTH, HKV * DIM, generator=_gen) / 4 for _ in range(LAYERS)]
WV = [torch.randn(WIDTH, HKV * DIM, generator=_gen) / 4 for _ in range(LAYERS)]


def stack(attention, x: torch.Tensor) -> torch.Tensor:
    for layer in range(LAYERS):
        h = torch.nn.functional.rms_norm(x, (WIDTH,))
        q = (h @ WQ[layer]).view(-1, HQ, DIM)
        k = torch.sin(h @ WK[layer]).view(-1, HKV, DIM)
        v = (h @ WV[layer]).view(-1, HKV, DIM)
        x = x + attention.run(layer, q, k, v).reshape(-1, WIDTH)
    return x


def _cache() -> KVCacheManager:
    return KVCacheManager(LAYERS, HKV, DIM, block_size=4, num_blocks=64)


def test_the_compiled_stack_computes_what_the_eager_one_does() -> None:
    compiled = compile_with_attention(stack)
    caches = [_cache(), _cache()]
    backends = [TorchAttentionBackend(kv) for kv in caches]
    gen = torch.Generator().manual_seed(1)
    before = counters["stats"]["unique_graphs"]
    steps = [[("a", 5), ("b", 3)], *[[("a", 1), ("b", 1)]] * 4, [("b", 1)], [("b", 1), ("c", 6)]]
    for rows in steps:
        x = torch.randn(sum(n for _, n in rows), WIDTH, generator=gen)
        outs = []
        for kv, backend, fn in zip(caches, backends, (stack, compiled), strict=True):
            for rid, n in rows:
                assert kv.append(rid, "main", n)
            backend.plan(AttentionBatch.build([(rid, "main", n) for rid, n in rows], kv, "cpu"))
            outs.append(fn(backend, x))
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    for layer in range(LAYERS):  # the compiled stack wrote the same keys and values
        torch.testing.assert_close(caches[1].k_cache(layer), caches[0].k_cache(layer), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(caches[1].v_cache(layer), caches[0].v_cache(layer), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] - before >= 1
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_attention_without_a_bound_backend_says_so() -> None:
    q = torch.randn(2, HQ, DIM)
    with pytest.raises(RuntimeError, match="no backend bound"):
        torch.ops.mstar.paged_attention(q, torch.randn(2, HKV, DIM), torch.randn(2, HKV, DIM), 0)
