"""A fixed pool of KV-cache block ids with all-or-nothing allocation."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class BlockPool:
    """Hands out block ids ``0 .. num_blocks-1``.

    Allocation never returns a partial set: a caller that cannot get every block it needs
    gets ``None`` and the pool is unchanged, so it can queue or preempt instead of crashing.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"BlockPool needs at least 1 block, got num_blocks={num_blocks}")
        self._num_blocks = num_blocks
        # FIFO: recently freed blocks are handed out last, which keeps their contents
        # around longest (useful once prefix reuse looks them up).
        self._free: deque[int] = deque(range(num_blocks))
        self._is_free = bytearray(b"\x01") * num_blocks

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self._num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """Take ``n`` blocks, or return ``None`` (and take nothing) if fewer are free."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            return None
        ids = [self._free.popleft() for _ in range(n)]
        for block_id in ids:
            self._is_free[block_id] = 0
        return ids

    def free(self, ids: Iterable[int]) -> None:
        """Return blocks to the pool. Unknown or already-free ids raise before anything changes."""
        ids = list(ids)
        seen: set[int] = set()
        for block_id in ids:
            if not 0 <= block_id < self._num_blocks:
                raise ValueError(
                    f"block id {block_id} is not in this pool (0..{self._num_blocks - 1})"
                )
            if self._is_free[block_id] or block_id in seen:
                raise ValueError(f"block {block_id} freed twice")
            seen.add(block_id)
        for block_id in ids:
            self._is_free[block_id] = 1
        self._free.extend(ids)

    def __repr__(self) -> str:
        return f"BlockPool(num_blocks={self._num_blocks}, num_free={self.num_free})"
