"""Paged KV cache of one KV-cache node: the cache tensors plus per-stream block tables."""

from __future__ import annotations

import math
import mmap
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from mstar.kv.block_pool import BlockPool
from mstar.kv.block_tables import BlockTables
from mstar.kv.prefix_cache import ROOT, BlockKey, PrefixCache, block_key

DEFAULT_STREAM = "main"

RequestId = Hashable


@dataclass
class _Stream:
    row: int  # its row in the manager's BlockTables
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0
    # Prefix caching: the keys of the full blocks fed so far, the identities of the
    # positions fed since the last full block, and whether every position had one.
    keys: list[BlockKey] = field(default_factory=list)
    pending: list[Hashable] = field(default_factory=list)
    cacheable: bool = True


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed cache tensor. On the CPU, anonymous memory from the OS (zero until written):
    a page costs resident memory only once a block on it is used, so an engine holds what
    its requests use, not its whole budget (torch.zeros writes every page up front)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, max(size, 1)), dtype=dtype, count=math.prod(shape)).view(shape)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Owns the paged K/V tensors of one node and the block tables of its requests.

    Layout per layer is FlashInfer's NHD paged layout, ``[num_blocks, block_size,
    num_kv_heads, head_dim]``, so a flashinfer backend can use the tensors as they are.
    A request may own several independent cache streams (e.g. guidance branches); each
    stream has its own block table. A stream nobody appended to reads as empty.

    With ``prefix_caching``, full blocks are indexed by the positions they hold
    (``mstar.kv.prefix_cache``): ``map_prefix`` gives a new stream the longest cached
    prefix of its positions, shared, and ``note_fed`` indexes blocks once they are written.
    Freed cached blocks stay until their space is needed; they count as free.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        prefix_caching: bool = False,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("block_size", block_size),
            ("num_blocks", num_blocks),
        ):
            if value < 1:
                raise ValueError(f"KVCacheManager: {name} must be >= 1, got {value}")
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        self._pool = BlockPool(num_blocks)
        self.prefix_cache = PrefixCache(self._pool) if prefix_caching else None
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zeroed, not empty: attention gathers padding slots and masks them out, and
        # masked-out garbage that happens to be NaN would still poison the output (0 * NaN).
        self._k = [_zeros(shape, dtype, self.device) for _ in range(num_layers)]
        self._v = [_zeros(shape, dtype, self.device) for _ in range(num_layers)]
        # [num_blocks * block_size, Hkv, D] views (one row per slot) for ``write``, made once.
        self._k_slots = [t.view(-1, num_kv_heads, head_dim) for t in self._k]
        self._v_slots = [t.view(-1, num_kv_heads, head_dim) for t in self._v]
        self._streams: dict[RequestId, dict[str, _Stream]] = {}
        self._tables = BlockTables()

    @staticmethod
    def bytes_per_block(
        num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
    ) -> int:
        """Bytes one block costs across all layers, K and V together."""
        element_size = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * element_size

    @classmethod
    def from_memory_budget(
        cls,
        budget_bytes: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        prefix_caching: bool = False,
    ) -> KVCacheManager:
        """As many blocks as fit in ``budget_bytes``."""
        per_block = cls.bytes_per_block(num_layers, num_kv_heads, head_dim, block_size, dtype)
        num_blocks = budget_bytes // per_block
        if num_blocks < 1:
            raise ValueError(
                f"KV cache budget of {budget_bytes} bytes fits no block: one block of "
                f"{block_size} tokens costs {per_block} bytes "
                f"(2 x {num_layers} layers x {num_kv_heads} kv heads x {head_dim} head_dim "
                f"x {block_size} tokens x {dtype})"
            )
        return cls(num_layers, num_kv_heads, head_dim, block_size, num_blocks, dtype, device, prefix_caching)

    @property
    def block_bytes(self) -> int:
        """Bytes one block of this cache costs across all layers, K and V together."""
        return self.bytes_per_block(self.num_layers, self.num_kv_heads, self.head_dim, self.block_size, self.dtype)

    # ---- storage -------------------------------------------------------------------------

    def k_cache(self, layer: int) -> torch.Tensor:
        return self._k[layer]

    def slot_rows(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V caches as [num_blocks * block_size, Hkv, D] (one row per
        slot): views of ``k_cache``/``v_cache``, what ``write`` writes into."""
        return self._k_slots[layer], self._v_slots[layer]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self._v[layer]

    def write(
        self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store ``k``/``v`` [T, Hkv, D] at flat slots ``block_id * block_size + offset``."""
        # Checked here: a no-op .to() still costs a dispatch, on every layer of every step.
        if k.dtype != self.dtype or v.dtype != self.dtype:
            k, v = k.to(self.dtype), v.to(self.dtype)
        self._k_slots[layer].index_copy_(0, slot_mapping, k)
        self._v_slots[layer].index_copy_(0, slot_mapping, v)

    # ---- usage counters ------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request can get: free ones and cached ones nobody references."""
        cached = self.prefix_cache.num_evictable if self.prefix_cache is not None else 0
        return self._pool.num_free + cached

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds."""
        return self._pool.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the prefix index (held or not)."""
        return self.prefix_cache.num_cached if self.prefix_cache is not None else 0

    def num_stream_blocks(self, stream: str) -> int:
        """Blocks the requests' streams named ``stream`` hold (e.g. cross-attention caches)."""
        return sum(len(s[stream].blocks) for s in self._streams.values() if stream in s)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0.0 .. 1.0."""
        return self.num_used_blocks / self._pool.num_blocks

    # ---- block tables --------------------------------------------------------------------

    def requests(self) -> list[RequestId]:
        return list(self._streams)

    def streams(self, request_id: RequestId) -> list[str]:
        return list(self._streams.get(request_id, ()))

    def num_tokens(self, request_id: RequestId, stream: str = DEFAULT_STREAM) -> int:
        state = self._lookup(request_id, stream)
        return state.num_tokens if state is not None else 0

    def block_table(self, request_id: RequestId, stream: str = DEFAULT_STREAM) -> list[int]:
        state = self._lookup(request_id, stream)
        return list(state.blocks) if state is not None else []

    def append(self, request_id: RequestId, stream: str, n_new: int) -> bool:
        """Grow the stream by ``n_new`` tokens, reserving blocks as needed.

        Returns False and changes nothing when the pool cannot cover the growth.
        """
        if n_new < 0:
            raise ValueError(f"n_new must be >= 0, got {n_new}")
        state = self._lookup(request_id, stream)
        have_tokens, have_blocks = (state.num_tokens, len(state.blocks)) if state is not None else (0, 0)
        needed = max(0, _ceil_div(have_tokens + n_new, self.block_size) - have_blocks)
        if needed == 0 and state is not None:  # a decode step inside its last block: the common case
            state.num_tokens += n_new
            return True
        cache = self.prefix_cache
        new_blocks = self._pool.allocate(needed) if cache is None else cache.allocate(needed)
        if new_blocks is None:
            return False
        state = state or self._stream(request_id, stream)
        if new_blocks:
            self._tables.write(state.row, len(state.blocks), new_blocks)
            state.blocks.extend(new_blocks)
        state.num_tokens += n_new
        return True

    def _stream(self, request_id: RequestId, stream: str) -> _Stream:
        streams = self._streams.setdefault(request_id, {})
        state = streams.get(stream)
        if state is None:
            state = streams[stream] = _Stream(self._tables.take_row())
        return state

    def table_rows(
        self, streams: Sequence[tuple[RequestId, str]], width: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(int32 [len(streams), width]: each stream's block table, zero-padded; int64
        [len(streams)]: how many blocks each holds; int64 [len(streams)]: their rows in the
        persistent tables, for ``tables_of_rows`` while ``tables_version`` stands still, or
        None when a stream does not exist). One copy from the persistent tables, no list per
        stream."""
        found = [self._streams.get(rid, {}).get(name) for rid, name in streams]
        if None in found:  # a stream nobody appended to: an empty table
            have = np.array([s is not None for s in found])
            out = np.zeros((len(streams), width), dtype=np.int32)
            out[have] = self._tables.gather(np.array([s.row for s in found if s is not None], dtype=np.int64), width)
            return out, np.array([len(s.blocks) if s is not None else 0 for s in found], dtype=np.int64), None
        counts = np.array([len(s.blocks) for s in found], dtype=np.int64)  # type: ignore[union-attr]
        rows = np.array([s.row for s in found], dtype=np.int64)  # type: ignore[union-attr]
        return self._tables.gather(rows, width), counts, rows

    @property
    def tables_version(self) -> int:
        """Changes whenever a stream is created or freed (see ``table_rows``)."""
        return self._tables.version

    def tables_of_rows(self, rows: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(int32 [len(rows), width], int64 [len(rows)]): the block tables of rows
        ``table_rows`` returned, and how many blocks each holds."""
        return self._tables.gather(rows, width), self._tables.held(rows)

    def free_stream(self, request_id: RequestId, stream: str = DEFAULT_STREAM) -> None:
        """Return one stream's blocks; a no-op when the stream does not exist."""
        streams = self._streams.get(request_id)
        if streams is None or stream not in streams:
            return
        state = streams.pop(stream)
        self._tables.release_row(state.row)
        self._release(state.blocks)
        if not streams:
            del self._streams[request_id]

    def free_request(self, request_id: RequestId) -> None:
        """Return every block of every stream of the request; idempotent."""
        streams = self._streams.pop(request_id, None)
        if streams is None:
            return
        for state in streams.values():
            self._tables.release_row(state.row)
            self._release(state.blocks)

    def _release(self, blocks: list[int]) -> None:
        if self.prefix_cache is None:
            self._pool.free(blocks)
        else:
            self.prefix_cache.release(blocks)

    # ---- prefix caching --------------------------------------------------------------------

    def map_prefix(
        self, request_id: RequestId, stream: str, identities: Sequence[Hashable], limit: int
    ) -> int:
        """Give an empty stream the cached blocks of the longest cached prefix of
        ``identities`` (one per position), at most ``limit`` positions, in whole blocks; the
        number of positions it now holds (0 without prefix caching or a hit)."""
        cache = self.prefix_cache
        if cache is None or self.num_tokens(request_id, stream):
            return 0
        bs = self.block_size
        keys: list[BlockKey] = []
        parent = ROOT
        for b in range(min(len(identities), limit) // bs):
            parent = block_key(parent, identities[b * bs : (b + 1) * bs])
            keys.append(parent)
        blocks = cache.lookup(keys)
        cache.queried_tokens += len(identities)
        cache.hit_tokens += len(blocks) * bs
        if blocks:
            state = self._stream(request_id, stream)
            state.blocks, state.num_tokens, state.keys = blocks, len(blocks) * bs, keys[: len(blocks)]
            self._tables.write(state.row, 0, blocks)
        return len(blocks) * bs

    def note_fed(
        self, request_id: RequestId, stream: str, start: int, identities: Sequence[Hashable] | None
    ) -> None:
        """Positions ``start ..`` of the stream were written, with these identities (None:
        they have none, so nothing from here on can be shared); full blocks enter the index."""
        state = self._lookup(request_id, stream)
        if self.prefix_cache is None or state is None or not state.cacheable:
            return
        bs = self.block_size
        if identities is None or start != len(state.keys) * bs + len(state.pending):
            state.cacheable = False  # positions fed out of order or not noted: stop sharing here
            state.pending = []
            return
        state.pending.extend(identities)
        while len(state.pending) >= bs:
            key = block_key(state.keys[-1] if state.keys else ROOT, state.pending[:bs])
            self.prefix_cache.register(state.blocks[len(state.keys)], key)
            state.keys.append(key)
            del state.pending[:bs]

    def _lookup(self, request_id: RequestId, stream: str) -> _Stream | None:
        return self._streams.get(request_id, {}).get(stream)

    def __repr__(self) -> str:
        return (
            f"KVCacheManager(layers={self.num_layers}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, block_size={self.block_size}, "
            f"blocks={self.num_used_blocks}/{self.num_blocks} used, dtype={self.dtype}, "
            f"device={self.device})"
        )
