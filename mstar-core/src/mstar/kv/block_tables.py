"""Every cache stream's block table as one row of a persistent int32 array.

A stream takes a row when it is created and gives it back when it is freed; appending
blocks writes only the new entries. A step's tables are then one fancy-index of the rows
in the batch instead of a Python list per row rebuilt every step. Entries past a row's
length are 0, the padding every consumer expects (a valid block to gather, masked out).
"""

from __future__ import annotations

import numpy as np


class BlockTables:
    def __init__(self, rows: int = 16, width: int = 16) -> None:
        self._array = np.zeros((rows, width), dtype=np.int32)
        self._held = np.zeros(rows, dtype=np.int64)  # blocks each row's stream holds
        self._free = list(range(rows - 1, -1, -1))  # popped from the end: row 0 first
        # Counts rows taken and released: while it stands still, every live stream keeps its
        # row, so a row index remembered from an earlier step still names the same stream.
        self.version = 0

    def take_row(self) -> int:
        self.version += 1
        if not self._free:
            old = self._array.shape[0]
            self._array = np.concatenate([self._array, np.zeros_like(self._array)])
            self._held = np.concatenate([self._held, np.zeros_like(self._held)])
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()

    def release_row(self, row: int) -> None:
        self.version += 1
        self._array[row] = 0
        self._held[row] = 0
        self._free.append(row)

    def write(self, row: int, start: int, blocks: list[int]) -> None:
        """Entries ``start .. start + len(blocks)`` of ``row``."""
        end = start + len(blocks)
        if end > self._array.shape[1]:
            width = max(end, 2 * self._array.shape[1])
            grown = np.zeros((self._array.shape[0], width), dtype=np.int32)
            grown[:, : self._array.shape[1]] = self._array
            self._array = grown
        self._array[row, start:end] = blocks
        self._held[row] = max(int(self._held[row]), end)

    def held(self, rows: np.ndarray) -> np.ndarray:
        """int64 [len(rows)]: how many blocks each of those rows' streams holds."""
        return self._held[rows]

    def gather(self, rows: np.ndarray, width: int) -> np.ndarray:
        """[len(rows), width] copy of those rows' first ``width`` entries (zero-padded)."""
        if width <= self._array.shape[1]:
            return self._array[rows, :width]
        out = np.zeros((len(rows), width), dtype=np.int32)
        out[:, : self._array.shape[1]] = self._array[rows]
        return out
