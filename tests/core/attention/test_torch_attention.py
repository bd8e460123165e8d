"""TorchAttentionBackend against an independent per-request dense reference."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from mstar.attention import AttentionBatch, AttentionRow, TorchAttentionBackend
from mstar.kv import KVCacheManager

NUM_LAYERS = 2
HEAD_DIM = 8


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Explicit softmax attention on contiguous tensors. q [Q, Hq, D], k/v [K, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def causal_allowed(q_len: int, kv_len: int) -> torch.Tensor:
    q_pos = torch.arange(kv_len - q_len, kv_len)[:, None]
    return torch.arange(kv_len)[None, :] <= q_pos


@dataclass
class Harness:
    """Drives steps the way a model would and keeps every stream's K/V contiguously."""

    kv: KVCacheManager
    num_q_heads: int
    scale: float | None = None
    history: dict[tuple[object, str], list[tuple[torch.Tensor, torch.Tensor]]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        self.backend = TorchAttentionBackend(self.kv)
        # Garbage (finite) in every slot: correctness must not depend on a zeroed cache.
        for layer in range(self.kv.num_layers):
            self.kv.k_cache(layer).normal_(0, 100)
            self.kv.v_cache(layer).normal_(0, 100)

    def step(self, rows: list[AttentionRow | tuple]) -> None:
        rows = [AttentionRow(*r) for r in rows]
        for r in rows:
            assert self.kv.append(r.request_id, r.stream, r.query_len)
        batch = AttentionBatch.build(rows, self.kv, "cpu")
        self.backend.plan(batch)
        T = sum(r.query_len for r in rows)
        hkv = self.kv.num_kv_heads
        for layer in range(self.kv.num_layers):
            q = torch.randn(T, self.num_q_heads, HEAD_DIM)
            k = torch.randn(T, hkv, HEAD_DIM)
            v = torch.randn(T, hkv, HEAD_DIM)
            out = self.backend.run(layer, q, k, v, scale=self.scale)
            assert out.shape == (T, self.num_q_heads, HEAD_DIM)
            assert torch.isfinite(out).all()
            start = 0
            for r in rows:
                end = start + r.query_len
                expected = self._reference_row(layer, r, q[start:end], k[start:end], v[start:end])
                torch.testing.assert_close(out[start:end], expected, atol=1e-5, rtol=1e-5)
                start = end

    def _reference_row(self, layer, row, q, k, v) -> torch.Tensor:
        layers = self.history.setdefault((row.request_id, row.stream), [])
        if len(layers) <= layer:
            layers.append((k[:0], v[:0]))
        k_all = torch.cat([layers[layer][0], k])
        v_all = torch.cat([layers[layer][1], v])
        layers[layer] = (k_all, v_all)
        kv_len = k_all.shape[0]
        if row.custom_mask is not None:
            allowed = row.custom_mask
        elif row.causal:
            allowed = causal_allowed(row.query_len, kv_len)
        else:
            allowed = torch.ones(row.query_len, kv_len, dtype=torch.bool)
        scale = self.scale if self.scale is not None else 1 / math.sqrt(HEAD_DIM)
        return reference_attention(q, k_all, v_all, allowed, scale)


def make_harness(block_size: int, num_q_heads: int, num_kv_heads: int, **kw) -> Harness:
    torch.manual_seed(0)
    kv = KVCacheManager(NUM_LAYERS, num_kv_heads, HEAD_DIM, block_size, num_blocks=128)
    return Harness(kv, num_q_heads, **kw)


@pytest.mark.parametrize("block_size", [1, 5, 12, 16])
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(4, 4), (8, 2)])
def test_ragged_prefill_then_mixed_and_decode_steps(
    block_size: int, num_q_heads: int, num_kv_heads: int
) -> None:
    h = make_harness(block_size, num_q_heads, num_kv_heads)
    h.step([("a", "main", 7), ("b", "main", 13)])
    # a new prefill next to decode rows, all in one batch
    h.step([("a", "main", 1), ("c", "main", 9), ("b", "main", 1)])
    for _ in range(3):
        h.step([("a", "main", 1), ("b", "main", 1), ("c", "main", 1)])
    # chunked prefill continuing a stream: several new tokens on top of a cached prefix
    h.step([("c", "main", 6), ("a", "main", 1)])


def test_decode_only_batch_single_token_prompts() -> None:
    h = make_harness(4, 8, 2)
    h.step([("a", "main", 1), ("b", "main", 1)])
    h.step([("a", "main", 1), ("b", "main", 1)])


def test_custom_mask_rows_and_bidirectional_rows() -> None:
    h = make_harness(5, 8, 2)
    prefix, q_len = 4, 10
    prefix_lm = causal_allowed(q_len, q_len)
    prefix_lm[:prefix, :prefix] = True  # bidirectional prefix, causal after it
    h.step(
        [
            AttentionRow("img", "main", q_len, custom_mask=prefix_lm),
            AttentionRow("enc", "main", 6, causal=False),
            AttentionRow("txt", "main", 3),
        ]
    )
    h.step([("img", "main", 1), ("txt", "main", 1)])
    # a custom-mask row on a stream that already holds tokens: mask spans the whole kv_len
    sliding = causal_allowed(2, 13) & (torch.arange(13)[None, :] >= 8)
    h.step([AttentionRow("img", "main", 2, custom_mask=sliding), ("txt", "main", 2)])


def test_several_streams_per_request() -> None:
    h = make_harness(16, 4, 2)
    h.step([("r", "cond", 11), ("r", "uncond", 4), ("s", "main", 6)])
    for _ in range(2):
        h.step([("r", "cond", 1), ("r", "uncond", 1), ("s", "main", 1)])
    h.kv.free_stream("r", "uncond")
    h.step([("r", "cond", 1), ("s", "main", 1)])


def test_reused_blocks_after_free() -> None:
    h = make_harness(3, 4, 4)
    h.step([("a", "main", 10), ("b", "main", 4)])
    h.kv.free_request("a")
    h.history.pop(("a", "main"))
    h.step([("c", "main", 12), ("b", "main", 1)])
    h.step([("c", "main", 1), ("b", "main", 1)])


def test_explicit_scale() -> None:
    h = make_harness(4, 4, 2, scale=0.05)
    h.step([("a", "main", 5), ("b", "main", 2)])
    h.step([("a", "main", 1), ("b", "main", 1)])


def test_run_writes_new_kv_at_slot_mapping() -> None:
    kv = KVCacheManager(1, 2, HEAD_DIM, block_size=4, num_blocks=8)
    backend = TorchAttentionBackend(kv)
    assert kv.append("a", "main", 6)
    batch = AttentionBatch.build([("a", "main", 6)], kv, "cpu")
    backend.plan(batch)
    k, v = torch.randn(6, 2, HEAD_DIM), torch.randn(6, 2, HEAD_DIM)
    backend.run(0, torch.randn(6, 2, HEAD_DIM), k, v)
    table = kv.block_table("a", "main")
    stored_k = kv.k_cache(0)[table].reshape(-1, 2, HEAD_DIM)[:6]
    stored_v = kv.v_cache(0)[table].reshape(-1, 2, HEAD_DIM)[:6]
    assert torch.equal(stored_k, k) and torch.equal(stored_v, v)


def test_run_rejects_bad_calls() -> None:
    kv = KVCacheManager(1, 2, HEAD_DIM, block_size=4, num_blocks=8)
    backend = TorchAttentionBackend(kv)
    q, k = torch.randn(3, 4, HEAD_DIM), torch.randn(3, 2, HEAD_DIM)
    with pytest.raises(RuntimeError, match="before plan"):
        backend.run(0, q, k, k)
    assert kv.append("a", "main", 3)
    backend.plan(AttentionBatch.build([("a", "main", 3)], kv))
    with pytest.raises(ValueError, match="k/v"):
        backend.run(0, q, k[:2], k[:2])
    with pytest.raises(ValueError, match="multiple"):
        backend.run(0, torch.randn(3, 3, HEAD_DIM), k, k)
    other = KVCacheManager(1, 2, HEAD_DIM, block_size=8, num_blocks=8)
    with pytest.raises(ValueError, match="block_size"):
        TorchAttentionBackend(other).plan(AttentionBatch.build([("a", "main", 3)], kv))
