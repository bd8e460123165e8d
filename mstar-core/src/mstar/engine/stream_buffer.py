"""Per-request buffer of a streaming edge: items appended by the producer, cut into chunks
for the consumer by the edge's chunk policy.

Items live in one preallocated tensor whose capacity doubles when full; appends are held
in a list until the next chunk is cut, then copied in at once, so storing costs O(chunk)
amortised and a chunk is a view, not O(stream). Stored items are never written over, so a
chunk handed out stays valid.

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
    # Items appended since the last chunk was cut: stored on the next cut, in one copy for
    # all of them (an append per row and step then costs a list append, not a tensor write).
    _pending: list[torch.Tensor] = field(default_factory=list, repr=False)
    _item_shape: torch.Size | None = field(default=None, repr=False)

    def append(self, value: torch.Tensor) -> None:
        value = value if value.dim() > 0 else value.reshape(1)
        shape = self._item_shape
        if shape is None:
            self._item_shape = value.shape[1:]
        elif value.shape[1:] != shape:
            raise ValueError(
                f"stream items must have shape [n, {', '.join(map(str, shape))}], got {tuple(value.shape)}"
            )
        # Held, not copied: the producer's outputs are fresh tensors every step.
        self._pending.append(value)
        self.length += value.shape[0]

    def _store(self) -> torch.Tensor | None:
        """The stream so far as one tensor (the pending items copied into it)."""
        pending = self._pending
        if not pending:
            return self._data
        self._pending = []
        new = pending[0] if len(pending) == 1 else torch.cat(pending)  # cat promotes dtypes
        n, data = new.shape[0], self._data
        stored = self.length - n
        if data is None:
            # Room for 16 small items; a large item (a prompt's states) reserves only itself.
            reserve = 16 if new[:1].numel() <= LARGE_ITEM else 1
            data = self._data = new.new_empty((max(n, reserve), *new.shape[1:]))
        # As torch.cat would promote (checked only when the dtypes differ).
        dtype = data.dtype if new.dtype is data.dtype else torch.promote_types(data.dtype, new.dtype)
        if self.length > data.shape[0] or dtype != data.dtype:
            capacity = max(2 * data.shape[0], self.length)
            grown = data.new_empty((capacity, *data.shape[1:]), dtype=dtype)
            grown[:stored] = data[:stored]
            data = self._data = grown
        data[stored : self.length] = new
        return data

    def next_chunk(self) -> tuple[torch.Tensor, int, int] | None:
        """(window, context_items, end) of the next chunk, without consuming it."""
        cut = self.policy.next_chunk(self.length, self.consumed, self.closed)
        if cut is None:
            if self.keep_past_end and self.closed:
                data = self._store()
                return (data[self.length : self.length] if data is not None else torch.empty(0)), 0, self.consumed
            return None
        data = self._store()
        if data is None:
            return None
        start, end, context = cut
        return data[start:end], context, end

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
