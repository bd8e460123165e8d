"""``OutputCache``: a stateless node's row outputs by key, bounded in bytes, least recently
used out first; its counters reach the wire, /metrics and /health."""

from __future__ import annotations

import torch
from mstar.engine.output_cache import OutputCache
from mstar.model.digest import tensor_digest
from mstar.server.engine_stats import engine_stats
from mstar.server.messages import NodeOutputCache
from mstar.server.metrics import ServerMetrics

KB = 1024


def _out(fill: float, n: int = 256) -> dict[str, torch.Tensor]:  # n float32 = n * 4 bytes
    return {"embeds": torch.full((n,), fill)}


def test_hit_returns_what_was_put_and_counts():
    cache = OutputCache(4 * KB, torch.device("cpu"))
    assert cache.get("a") is None
    batch = torch.arange(512.0)
    cache.put("a", {"embeds": batch[:256]})  # a view of a larger batch tensor
    batch.zero_()  # the batch's storage is reused: the cache kept its own copy
    hit = cache.get("a")
    assert hit is not None and torch.equal(hit["embeds"], torch.arange(256.0))
    assert (cache.hits, cache.misses, cache.bytes, len(cache)) == (1, 1, 1 * KB, 1)


def test_bytes_bound_evicts_least_recently_used():
    cache = OutputCache(3 * KB, torch.device("cpu"))
    for key in "abc":
        cache.put(key, _out(float(ord(key))))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("d", _out(4.0))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("d") is not None
    assert (cache.evictions, cache.bytes, len(cache)) == (1, 3 * KB, 3)
    cache.put("huge", _out(1.0, n=1024))  # 4 KiB: larger than the whole cache, not kept
    assert cache.get("huge") is None and len(cache) == 3 and cache.evictions == 1
    cache.put("a", _out(9.0, n=512))  # replacing an entry frees its old bytes first: only c goes
    assert (cache.evictions, cache.bytes, len(cache)) == (2, 3 * KB, 2)
    assert float(cache.get("a")["embeds"][0]) == 9.0 and cache.get("d") is not None


def test_digest_tells_contents_dtypes_and_shapes_apart():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    assert tensor_digest(x) == tensor_digest(x.clone())
    assert tensor_digest(x.t()) == tensor_digest(x.t().contiguous())
    others = [x + 1e-6, x.reshape(6, 4), x.double(), x.bfloat16(), x[:3]]
    assert len({tensor_digest(t) for t in [x, *others]}) == 1 + len(others)
    assert tensor_digest(x, x) != tensor_digest(x)


class _Engine:
    def stats(self) -> dict:
        return {"waiting": 0, "running": 0, "steps": 1, "preemptions": 0, "last_batch_size": 0, "requests": 2, "kv": {},
                "output_cache": {"vision_encoder": {"entries": 2, "bytes": 4096, "hits": 3, "misses": 2, "evictions": 0}}}


def test_counters_reach_the_wire_and_metrics():
    stats = engine_stats(_Engine())
    assert stats.output_cache == [NodeOutputCache("vision_encoder", 2, 4096, 3, 2, 0)]
    metrics = ServerMetrics("m")
    metrics.engine_stats("0", "0", stats)
    text = metrics.render().decode()
    assert 'mstar_output_cache_hits{engine="0",model="m",node="vision_encoder",replica="0"} 3.0' in text
    assert 'mstar_output_cache_bytes{engine="0",model="m",node="vision_encoder",replica="0"} 4096.0' in text
