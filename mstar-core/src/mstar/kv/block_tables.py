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
        self._free = list(range(rows - 1, -1, -1))  # popped from the end: row 0 first

    def take_row(self) -> int:
        if not self._free:
            old = self._array.shape[0]
            self._array = np.concatenate([self._array, np.zeros_like(self._array)])
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()

    def release_row(self, row: int) -> None:
        self._array[row] = 0
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

    def gather(self, rows: np.ndarray, width: int) -> np.ndarray:
        """[len(rows), width] copy of those rows' first ``width`` entries (zero-padded)."""
        if width <= self._array.shape[1]:
            return self._array[rows, :width]
        out = np.zeros((len(rows), width), dtype=np.int32)
        out[:, : self._array.shape[1]] = self._array[rows]
        return out
