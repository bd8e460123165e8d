"""Chunk policies: how a streaming edge cuts a growing signal into chunks for its consumer.

A stream is a sequence of items along dim 0 (tokens, frames). A policy answers, given how
many items have arrived, how many were already consumed, and whether the producer is done,
which slice the consumer gets next: ``(start, end, emit_from)`` where ``[start, end)`` is the
window fed to the consumer and ``emit_from`` is how many leading items of that window are
context only (their output is not new). ``None`` means wait for more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class ChunkPolicy(Protocol):
    def next_chunk(self, available: int, consumed: int, closed: bool) -> tuple[int, int, int] | None:
        """``consumed`` counts items already emitted as new; see the module docstring."""
        ...


@dataclass(frozen=True)
class FixedChunks:
    """Non-overlapping chunks of ``size`` items; the last one may be shorter."""

    size: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"FixedChunks.size must be >= 1, got {self.size}")

    def next_chunk(self, available: int, consumed: int, closed: bool) -> tuple[int, int, int] | None:
        if available - consumed >= self.size:
            return consumed, consumed + self.size, 0
        if closed and available > consumed:
            return consumed, available, 0
        return None


@dataclass(frozen=True)
class SlidingWindowChunks:
    """A window of ``window`` items every ``hop`` new items; the consumer emits only the
    output of the newest ``hop`` items (the rest is context). Before the first full window
    nothing is emitted; a closed stream flushes what is left with the same context."""

    window: int
    hop: int

    def __post_init__(self) -> None:
        if not 1 <= self.hop <= self.window:
            raise ValueError(f"SlidingWindowChunks needs 1 <= hop <= window, got {self}")

    def next_chunk(self, available: int, consumed: int, closed: bool) -> tuple[int, int, int] | None:
        end = max(consumed + self.hop, self.window)
        if available >= end:
            start = end - self.window
            return start, end, consumed - start
        if closed and available > consumed:
            start = max(0, available - self.window)
            return start, available, consumed - start
        return None


@dataclass(frozen=True)
class LeftContextChunks:
    """Chunks of ``chunk`` new items, each fed with up to ``left_context`` items before it;
    the first chunk may be smaller (``first_chunk``) so output starts early."""

    chunk: int
    left_context: int = 0
    first_chunk: int | None = None

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.left_context < 0 or (self.first_chunk is not None and self.first_chunk < 1):
            raise ValueError(f"invalid LeftContextChunks {self}")

    def next_chunk(self, available: int, consumed: int, closed: bool) -> tuple[int, int, int] | None:
        size = self.first_chunk if consumed == 0 and self.first_chunk else self.chunk
        if available - consumed >= size:
            end = consumed + size
        elif closed and available > consumed:
            end = available
        else:
            return None
        start = max(0, consumed - self.left_context)
        return start, end, consumed - start
