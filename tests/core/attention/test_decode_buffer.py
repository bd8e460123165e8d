"""The torch backend's decode buffer: decode steps that append to last step's gathered K/V
give bit-identical outputs to gathering from the paged cache every step."""

from __future__ import annotations

import torch
from mstar.attention import AttentionBatch, TorchAttentionBackend
from mstar.attention.decode_buffer import HEADROOM_TOKENS
from mstar.kv import KVCacheManager

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
