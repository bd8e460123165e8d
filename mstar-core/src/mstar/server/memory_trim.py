"""Give freed heap memory back to the OS from an engine process.

On CPU, torch's tensors come from glibc ``malloc``, which keeps freed memory in its arenas:
an engine's resident memory rises to the high-water mark of its largest batch and stays
there (an Orpheus engine: 886 -> 1060 MiB after one 24-request batch, 746 MiB after
``malloc_trim(0)``; ``benchmarks/engine_memory.py``). That reads as a leak on a dashboard and
holds memory other processes could use. ``MemoryTrimmer`` calls ``malloc_trim(0)`` once each
time the engine goes idle after work, and every ``busy_interval_s`` under steady load. Where
the C library has no ``malloc_trim`` (not glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def glibc_malloc_trim() -> Callable[[], int] | None:
    """``malloc_trim(0)`` of the process's C library, or None where there is none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: int(fn(0))


class MemoryTrimmer:
    """``tick(steps, running)`` from a loop that runs often (the engine's command loop):
    ``steps`` counts engine steps so far, ``running`` the requests in flight."""

    def __init__(
        self,
        trim: Callable[[], int] | None,
        busy_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trim = trim
        self.busy_interval_s = busy_interval_s
        self.clock = clock
        self.trims = 0
        self._steps_at_trim = 0
        self._last_trim = clock()

    def tick(self, steps: int, running: int) -> bool:
        """Trim if there was work since the last trim and the engine is now idle, or the
        engine has been busy for ``busy_interval_s``; returns whether it trimmed."""
        if self.trim is None or steps == self._steps_at_trim:
            return False
        now = self.clock()
        if running and now - self._last_trim < self.busy_interval_s:
            return False
        self.trim()
        self.trims += 1
        self._steps_at_trim, self._last_trim = steps, now
        log.debug("malloc_trim after step %d (%d running)", steps, running)
        return True
