"""Paged KV cache: a block pool and the per-node cache manager."""

from mstar.kv.block_pool import BlockPool
from mstar.kv.cache_manager import DEFAULT_STREAM, KVCacheManager

__all__ = ["DEFAULT_STREAM", "BlockPool", "KVCacheManager"]
