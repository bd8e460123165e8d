"""Per-request buffer of a streaming edge: items appended by the producer, cut into chunks
for the consumer by the edge's chunk policy.

Items live in one preallocated tensor whose capacity doubles when full, so an append
copies only the new items (amortised) and a chunk is a view: both cost O(chunk), not
O(stream). Appends never write over stored items, so a chunk handed out stays valid.

With ``past_end`` enabled (an edge with a ``past_end_signal``), a closed and drained
stream keeps answering with empty chunks, counting the ones consumed in ``past_end``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mstar.graph import ChunkPolicy

LARGE_ITEM = 1 << 16  # elements


@dataclass
class StreamBuffer:
    policy: ChunkPolicy
    length: int = 0  # items along dim 0
    consumed: int = 0
    closed: bool = False
    keep_past_end: bool = False
    past_end: int = 0  # empty chunks consumed after the stream closed and drained
    _data: torch.Tensor | None = field(default=None, repr=False)

    def append(self, value: torch.Tensor) -> None:
        value = value if value.dim() > 0 else value.reshape(1)
        n = value.shape[0]
        data = self._data
        if data is None:
            # Room for 16 small items; a large item (a prompt's states) reserves only itself.
            reserve = 16 if value[:1].numel() <= LARGE_ITEM else 1
            data = self._data = value.new_empty((max(n, reserve), *value.shape[1:]))
        elif value.shape[1:] != data.shape[1:]:
            raise ValueError(
                f"stream items must have shape [n, {', '.join(map(str, data.shape[1:]))}], "
                f"got {tuple(value.shape)}"
            )
        # As torch.cat would promote (checked only when the dtypes differ: an append per row
        # and step is the common case, and promote_types is a dispatched call).
        dtype = data.dtype if value.dtype is data.dtype else torch.promote_types(data.dtype, value.dtype)
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
        if cut is None and self.keep_past_end and self.closed:
            empty = self._data[self.length : self.length] if self._data is not None else torch.empty(0)
            return empty, 0, self.consumed
        if cut is None or self._data is None:
            return None
        start, end, context = cut
        return self._data[start:end], context, end

    @property
    def is_past_end(self) -> bool:
        """The next chunk is an empty one after the end (``keep_past_end`` streams)."""
        return self.keep_past_end and self.drained

    def consume(self, end: int) -> None:
        if self.is_past_end and end == self.consumed:
            self.past_end += 1
        self.consumed = end

    @property
    def drained(self) -> bool:
        return self.closed and self.policy.next_chunk(self.length, self.consumed, True) is None
