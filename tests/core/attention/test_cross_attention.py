"""Cross-attention over the paged cache (mstar.attention.cross) against dense SDPA per row:
rows of different encoder lengths, prefill and decode queries in one step, caches written
once and read on later steps (the gathered K/V kept only while nothing changed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mstar.attention import TorchAttentionBackend
from mstar.attention.cross import CROSS_STREAM, CrossAttentionBatch
from mstar.kv import KVCacheManager

HQ, HKV, D, LAYERS = 4, 2, 8, 2


def make(reuse_bytes: int | None = None) -> tuple[KVCacheManager, TorchAttentionBackend]:
    kv = KVCacheManager(LAYERS, HKV, D, block_size=4, num_blocks=64)
    backend = TorchAttentionBackend(kv)
    if reuse_bytes is not None:
        backend._cross.reuse_bytes = reuse_bytes
    return kv, backend


def reference(q_rows: list[torch.Tensor], kv_rows: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Each row's queries [n, Hq, D] over its own K/V [S, Hkv, D], no mask: dense SDPA."""
    outs = []
    for q, (k, v) in zip(q_rows, kv_rows, strict=True):
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           enable_gqa=True)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("reuse_bytes", [None, 0])
def test_rows_of_different_lengths_written_then_read(reuse_bytes) -> None:
    torch.manual_seed(0)
    kv, backend = make(reuse_bytes)
    lens = {"a": 5, "b": 11, "c": 8}
    states = {rid: [(torch.randn(n, HKV, D), torch.randn(n, HKV, D)) for _ in range(LAYERS)] for rid, n in lens.items()}
    for rid, n in lens.items():
        assert kv.append(rid, CROSS_STREAM, n)
    kv.append("filler", CROSS_STREAM, 3)  # another request's blocks between theirs

    def step(rids: list[str], q_lens: list[int], writes: tuple[int, ...]) -> None:
        batch = CrossAttentionBatch.build(rids, q_lens, kv, torch.device("cpu"), writes)
        backend.plan_cross(batch)
        for layer in range(LAYERS):
            q = torch.randn(sum(q_lens), HQ, D)
            k = torch.cat([states[rids[i]][layer][0] for i in writes]) if writes else None
            v = torch.cat([states[rids[i]][layer][1] for i in writes]) if writes else None
            got = backend.cross(layer, q, k, v)
            want = reference(list(q.split(q_lens)), [states[r][layer] for r in rids])
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    step(["a", "b"], [3, 1], (0, 1))  # two prefills writing their caches
    step(["a", "b"], [1, 1], ())  # decode: read only
    step(["a", "b"], [1, 1], ())  # again (the kept gather, when reuse is on)
    step(["a", "b", "c"], [1, 1, 4], (2,))  # c joins with its prefill and writes
    step(["c", "a"], [1, 1], ())  # b left; other order
    step(["a", "b"], [1, 1], ())
    # b preempted and recomputed: the same rows and lengths, its cache in other blocks
    kv.free_request("b")
    kv.append("filler2", CROSS_STREAM, 6)
    assert kv.append("b", CROSS_STREAM, lens["b"])
    states["b"] = [(torch.randn(lens["b"], HKV, D), torch.randn(lens["b"], HKV, D)) for _ in range(LAYERS)]
    step(["a", "b"], [1, 1], (1,))
    step(["a", "b"], [1, 1], ())


def test_k_v_must_come_exactly_with_writes() -> None:
    kv, backend = make()
    kv.append("a", CROSS_STREAM, 5)
    backend.plan_cross(CrossAttentionBatch.build(["a"], [1], kv, torch.device("cpu"), (0,)))
    with pytest.raises(ValueError, match="exactly when the step writes"):
        backend.cross(0, torch.randn(1, HQ, D))
    with pytest.raises(ValueError, match="hold 4 positions"):
        backend.cross(0, torch.randn(1, HQ, D), torch.randn(4, HKV, D), torch.randn(4, HKV, D))
    backend.plan_cross(CrossAttentionBatch.build(["a"], [1], kv, torch.device("cpu")))
    with pytest.raises(ValueError, match="exactly when the step writes"):
        backend.cross(0, torch.randn(1, HQ, D), torch.randn(5, HKV, D), torch.randn(5, HKV, D))


def test_a_request_without_a_cross_cache_is_named() -> None:
    kv, _ = make()
    with pytest.raises(ValueError, match="'x' has no cross-attention cache"):
        CrossAttentionBatch.build(["x"], [1], kv, torch.device("cpu"))
