"""On the CPU the paged cache takes resident memory as its blocks are used, not its whole
budget at construction: an engine with a large budget and little traffic stays small
(the test suite keeps dozens of engines alive at once)."""

from __future__ import annotations

import gc

import torch
from mstar.kv import KVCacheManager

MiB = 1 << 20


def _rss() -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) * 1024


def test_budget_is_not_resident_until_used_and_returns_when_dropped() -> None:
    gc.collect()
    start = _rss()
    kv = KVCacheManager.from_memory_budget(512 * MiB, num_layers=8, num_kv_heads=4, head_dim=64, block_size=16)
    assert _rss() - start < 32 * MiB
    # Zero where read (reading the whole cache would fault every page in).
    assert not any(bool(kv.k_cache(i)[b].any()) or bool(kv.v_cache(i)[b].any()) for i in range(8) for b in (0, -1))
    assert kv.append("a", "main", 16 * 64)  # 64 blocks of 16 KiB per layer, K and V: 16 MiB
    slots = torch.arange(16 * 64)
    for layer in range(8):
        kv.write(layer, slots, torch.ones(16 * 64, 4, 64), torch.ones(16 * 64, 4, 64))
    grown = _rss() - start
    assert 12 * MiB < grown < 64 * MiB, grown
    del kv
    gc.collect()
    assert _rss() - start < 32 * MiB
