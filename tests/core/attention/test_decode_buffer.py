"""The torch backend's decode buffer: decode steps that append to last step's gathered K/V
give bit-identical outputs to gathering from the paged cache every step."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from mstar.attention import AttentionBatch, TorchAttentionBackend
from mstar.attention.decode_buffer import HEADROOM_TOKENS
from mstar.kv import KVCacheManager
from torch.utils._python_dispatch import TorchDispatchMode

LAYERS, HQ, HKV, DIM = 2, 4, 2, 8


class Pair:
    """The same steps through a buffered and an unbuffered backend, each on its own cache."""

    def __init__(self, block_size: int, num_blocks: int = 256) -> None:
        self.caches = [KVCacheManager(LAYERS, HKV, DIM, block_size, num_blocks=num_blocks) for _ in range(2)]
        for kv in self.caches:  # identical finite garbage in every slot
            gen = torch.Generator().manual_seed(1)
            for layer in range(LAYERS):
                kv.k_cache(layer).normal_(0, 10, generator=gen)
                kv.v_cache(layer).normal_(0, 10, generator=gen)
        self.buffered = TorchAttentionBackend(self.caches[0], decode_buffer=True)
        self.plain = TorchAttentionBackend(self.caches[1], decode_buffer=False)
        self.gen = torch.Generator().manual_seed(0)
        self.modes: list[str] = []

    def step(self, rows: list[tuple[str, int]], layers: int = LAYERS) -> None:
        for kv in self.caches:
            for rid, n in rows:
                assert kv.append(rid, "main", n)
        tokens = sum(n for _, n in rows)
        for backend, kv in ((self.buffered, self.caches[0]), (self.plain, self.caches[1])):
            backend.plan(AttentionBatch.build([(rid, "main", n) for rid, n in rows], kv, "cpu"))
        buf = self.buffered._plan.buffer
        self.modes.append("gather" if buf is None else "fill" if buf.fill else "append")
        for layer in range(layers):
            q = torch.randn(tokens, HQ, DIM, generator=self.gen)
            k = torch.randn(tokens, HKV, DIM, generator=self.gen)
            v = torch.randn(tokens, HKV, DIM, generator=self.gen)
            out = self.buffered.run(layer, q, k, v)
            expected = self.plain.run(layer, q, k, v)
            assert torch.equal(out, expected), (len(self.modes), layer, (out - expected).abs().max())


def test_buffered_decode_equals_gathering_every_step() -> None:
    p = Pair(block_size=4)
    p.step([("a", 7), ("b", 13)])  # prefill: gathered
    for _ in range(5):
        p.step([("a", 1), ("b", 1)])  # the first fills, then appends
    p.step([("b", 1)])  # a left: fill
    p.step([("b", 1), ("c", 5)])  # c's prefill beside b's decode: gathered
    p.step([("b", 1), ("c", 1)])
    p.step([("b", 1), ("c", 1)], layers=1)  # a forward that stopped after layer 0
    p.step([("b", 1), ("c", 1)])  # so this one fills again
    p.step([("b", 1), ("c", 1)])
    p.caches[0].free_request("c")
    p.caches[1].free_request("c")
    p.step([("b", 1), ("c", 1)])  # c's cache was freed and restarted: fill
    assert p.modes == [
        "gather", "fill", "append", "append", "append", "append", "fill", "gather",
        "fill", "append", "fill", "append", "fill",
    ]


def test_rows_outgrowing_the_buffer_refill() -> None:
    p = Pair(block_size=3, num_blocks=512)
    p.step([("a", 2), ("b", 9)])
    for _ in range(HEADROOM_TOKENS + 6):
        p.step([("a", 1), ("b", 1)])
    fills = [i for i, m in enumerate(p.modes) if m == "fill"]
    assert fills[0] == 1 and len(fills) >= 2  # appended until the headroom ran out
    assert p.modes.count("append") >= HEADROOM_TOKENS


def test_rows_over_the_memory_budget_gather_instead() -> None:
    # 64 blocks of 4: the buffer may hold 64 tokens, less than two rows plus their headroom.
    p = Pair(block_size=4, num_blocks=64)
    p.step([("a", 7), ("b", 13)])
    for _ in range(3):
        p.step([("a", 1), ("b", 1)])
    assert p.modes == ["gather"] * 4
    assert not p.buffered._buffer._storage  # nothing was allocated beside the paged cache


class OpCounter(TorchDispatchMode):
    """Every aten op dispatched inside the block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_equal_length_decode_rows_match_dense_sdpa_bitwise() -> None:
    """Rows of one length: no mask and no block padding, so the output is exactly one dense
    SDPA over the rows' contiguous keys (what a bare loop computes), buffered or gathered.
    Rows of different lengths: the longest row equals its per-row dense SDPA exactly, the
    others to rounding."""
    hq, hkv, dim, block_size = 8, 4, 64, 16
    gen = torch.Generator().manual_seed(3)
    for lengths in ([21, 21, 21], [5, 37, 12]):
        kv = KVCacheManager(1, hkv, dim, block_size, num_blocks=64)
        backends = [TorchAttentionBackend(kv, decode_buffer=True), TorchAttentionBackend(kv, decode_buffer=False)]
        rows = [f"r{i}" for i in range(len(lengths))]
        history = [(torch.randn(n, hkv, dim, generator=gen), torch.randn(n, hkv, dim, generator=gen)) for n in lengths]
        for rid, n in zip(rows, lengths, strict=True):
            assert kv.append(rid, "main", n)
        slots = AttentionBatch.build([(rid, "main", n) for rid, n in zip(rows, lengths, strict=True)], kv).slot_mapping
        kv.write(0, slots, torch.cat([h[0] for h in history]), torch.cat([h[1] for h in history]))
        for step in range(20):
            for rid in rows:
                assert kv.append(rid, "main", 1)
            batch = AttentionBatch.build([(rid, "main", 1) for rid in rows], kv)
            q = torch.randn(len(rows), hq, dim, generator=gen)
            k = torch.randn(len(rows), hkv, dim, generator=gen)
            v = torch.randn(len(rows), hkv, dim, generator=gen)
            history = [(torch.cat([hk, k[b : b + 1]]), torch.cat([hv, v[b : b + 1]])) for b, (hk, hv) in enumerate(history)]
            for backend in backends:
                backend.plan(batch)
                assert (backend._plan.mask is None) == (len(set(lengths)) == 1)
                out = backend.run(0, q, k, v)
                if len(set(lengths)) == 1:
                    # The bare loop's call: one SDPA over the rows' contiguous keys, batched
                    # (same shape, so the same work split over threads, whatever their number).
                    keys = torch.stack([hk for hk, _ in history]).transpose(1, 2)
                    values = torch.stack([hv for _, hv in history]).transpose(1, 2)
                    dense = F.scaled_dot_product_attention(q[:, :, None], keys, values, enable_gqa=True)[:, :, 0]
                    assert torch.equal(out, dense), (lengths, step)
                    continue
                for b, (hk, hv) in enumerate(history):
                    dense = F.scaled_dot_product_attention(
                        q[b][None, :, None], hk.transpose(0, 1)[None], hv.transpose(0, 1)[None], enable_gqa=True
                    )[0, :, 0]
                    if lengths[b] == max(lengths):
                        assert torch.equal(out[b], dense), (lengths, step, b)
                    else:
                        torch.testing.assert_close(out[b], dense, atol=1e-5, rtol=1e-5)


def test_appending_decode_step_issues_few_ops() -> None:
    """A decode step served by appending: per layer, the new K/V written to the paged cache
    and the buffer, views of the buffer, one SDPA; no gather, mask or dtype copies."""
    p = Pair(block_size=4)
    p.step([("a", 7), ("b", 7)])
    p.step([("a", 1), ("b", 1)])  # fill
    for kv in p.caches:
        for rid in "ab":
            assert kv.append(rid, "main", 1)
    backend, kv = p.buffered, p.caches[0]
    backend.plan(AttentionBatch.build([("a", "main", 1), ("b", "main", 1)], kv, "cpu"))
    assert not backend._plan.buffer.fill
    q, k, v = torch.randn(2, HQ, DIM), torch.randn(2, HKV, DIM), torch.randn(2, HKV, DIM)
    with OpCounter() as counter:
        backend.run(0, q, k, v)
    assert counter.ops["index_copy_"] == 4, counter.ops  # K and V, paged cache and buffer
    assert not {"index_select", "where", "_to_copy", "copy_"} & set(counter.ops), counter.ops
    assert sum(counter.ops.values()) <= 10, counter.ops  # 27 before the buffer kept views
