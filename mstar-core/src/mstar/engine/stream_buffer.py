"""Per-request buffer of a streaming edge: items appended by the producer, cut into chunks
for the consumer by the edge's chunk policy."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mstar.graph import ChunkPolicy


@dataclass
class StreamBuffer:
    policy: ChunkPolicy
    items: list[torch.Tensor] = field(default_factory=list)
    length: int = 0  # items along dim 0
    consumed: int = 0
    closed: bool = False

    def append(self, value: torch.Tensor) -> None:
        value = value if value.dim() > 0 else value.reshape(1)
        self.items.append(value)
        self.length += value.shape[0]

    def next_chunk(self) -> tuple[torch.Tensor, int, int] | None:
        """(window, context_items, end) of the next chunk, without consuming it."""
        cut = self.policy.next_chunk(self.length, self.consumed, self.closed)
        if cut is None:
            return None
        start, end, context = cut
        if len(self.items) > 1:
            self.items = [torch.cat(self.items, dim=0)]
        return self.items[0][start:end], context, end

    def consume(self, end: int) -> None:
        self.consumed = end

    @property
    def drained(self) -> bool:
        return self.closed and self.policy.next_chunk(self.length, self.consumed, True) is None
