"""Per-request buffer of a streaming edge: items appended by the producer, cut into chunks
for the consumer by the edge's chunk policy.

Items live in one preallocated tensor whose capacity doubles when full, so an append
copies only the new items (amortised) and a chunk is a view: both cost O(chunk), not
O(stream). Appends never write over stored items, so a chunk handed out stays valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mstar.graph import ChunkPolicy


@dataclass
class StreamBuffer:
    policy: ChunkPolicy
    length: int = 0  # items along dim 0
    consumed: int = 0
    closed: bool = False
    _data: torch.Tensor | None = field(default=None, repr=False)

    def append(self, value: torch.Tensor) -> None:
        value = value if value.dim() > 0 else value.reshape(1)
        n = value.shape[0]
        data = self._data
        if data is None:
            data = self._data = value.new_empty((max(n, 16), *value.shape[1:]))
        elif value.shape[1:] != data.shape[1:]:
            raise ValueError(
                f"stream items must have shape [n, {', '.join(map(str, data.shape[1:]))}], "
                f"got {tuple(value.shape)}"
            )
        dtype = torch.promote_types(data.dtype, value.dtype)  # as torch.cat would
        if self.length + n > data.shape[0] or dtype != data.dtype:
            capacity = max(2 * data.shape[0], self.length + n)
            grown = data.new_empty((capacity, *data.shape[1:]), dtype=dtype)
            grown[: self.length] = data[: self.length]
            data = self._data = grown
        data[self.length : self.length + n] = value
        self.length += n

    def next_chunk(self) -> tuple[torch.Tensor, int, int] | None:
        """(window, context_items, end) of the next chunk, without consuming it."""
        cut = self.policy.next_chunk(self.length, self.consumed, self.closed)
        if cut is None or self._data is None:
            return None
        start, end, context = cut
        return self._data[start:end], context, end

    def consume(self, end: int) -> None:
        self.consumed = end

    @property
    def drained(self) -> bool:
        return self.closed and self.policy.next_chunk(self.length, self.consumed, True) is None
