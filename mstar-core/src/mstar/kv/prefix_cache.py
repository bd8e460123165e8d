"""Prefix caching: full KV blocks indexed by what they hold, shared by every request that
feeds the same positions.

A block's key chains its parent's key with the identity of the ``block_size`` positions it
holds (by default their token ids; a plugin can name more, see
``ARNodeSubmodule.prefix_cache_keys``), so equal keys mean equal prefixes up to and
including that block. Blocks are reference counted: a request that maps a cached block
shares it read-only and computes only what follows. A cached block nobody references stays
in the index, evictable, until its space is needed: allocation takes free blocks first and
then evicts the least recently used cached block. Preemption and aborts only drop
references; a block in use is never evicted.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from mstar.kv.block_pool import BlockPool

BlockKey = bytes
ROOT: BlockKey = b""


def block_key(parent: BlockKey, positions: Sequence[Hashable]) -> BlockKey:
    """The key of a block whose positions have these identities, after ``parent``'s block."""
    # repr is stable for ints, strings, bytes and tuples of them (the identities plugins give).
    return hashlib.blake2b(parent + repr(tuple(positions)).encode(), digest_size=16).digest()


class PrefixCache:
    """The index of cached blocks over a ``BlockPool``, with reference counts and LRU eviction."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self._refs: dict[int, int] = {}  # blocks handed out -> holders (absent: 1)
        self._block_of: dict[BlockKey, int] = {}
        self._key_of: dict[int, BlockKey] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; LRU first
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.evictions = 0

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._key_of)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` blocks, evicting least recently used cached blocks when too few are free;
        None (nothing taken) when even that is not enough."""
        short = n - self.pool.num_free
        if short > len(self._evictable):
            return None
        for _ in range(max(0, short)):
            block, _ = self._evictable.popitem(last=False)
            del self._block_of[self._key_of.pop(block)]
            self.pool.free([block])
            self.evictions += 1
        return self.pool.allocate(n)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block: an unreferenced cached block becomes evictable
        (most recently used), any other returns to the pool."""
        plain = []
        for block in blocks:
            refs = self._refs.pop(block, 1) - 1
            if refs > 0:
                self._refs[block] = refs
            elif block in self._key_of:
                self._evictable[block] = None
            else:
                plain.append(block)
        if plain:
            self.pool.free(plain)

    def lookup(self, keys: Sequence[BlockKey]) -> list[int]:
        """Blocks of the longest cached run of ``keys`` (consecutive from the first), each
        now referenced once more by the caller."""
        found = []
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            found.append(block)
        for block in found:
            if block in self._evictable:
                del self._evictable[block]  # unreferenced until now: the caller holds it
            else:
                self._refs[block] = self._refs.get(block, 1) + 1
        return found

    def register(self, block: int, key: BlockKey) -> None:
        """``block`` (full, written) holds the positions ``key`` names; a key already cached
        keeps its block, and this one stays private to its request."""
        if key not in self._block_of and block not in self._key_of:
            self._block_of[key] = block
            self._key_of[block] = key

    def references(self, block: int) -> int:
        """Holders of a handed-out block (0: cached and evictable)."""
        return 0 if block in self._evictable else self._refs.get(block, 1)
