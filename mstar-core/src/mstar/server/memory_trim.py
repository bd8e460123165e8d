"""Give freed heap memory back to the OS from an engine process.

On CPU, torch's tensors come from glibc ``malloc``, which keeps freed memory in its heap:
once a freed mmapped block raises glibc's mmap threshold (it adapts up to 32 MiB), the
``[rows, vocab]`` float32 temporaries of every LM step (logits and the sampler's copies:
14 MiB each at 24 rows and Orpheus's 156,940 tokens) come from the heap, and as the batch
size changes from step to step they no longer fit the holes the previous sizes left. The heap
then grows while the memory in use stays put (an in-process Orpheus engine: 150 MiB in
use, heap 114 -> 319 MiB over three 24-request batches; ``benchmarks/engine_memory.py``).
A fixed low mmap threshold would return each block at free, but every block then faults in
fresh pages (``MALLOC_MMAP_THRESHOLD_=1048576``: 22.5 instead of 16.9 CPU seconds for the
same three batches, one run on a shared machine), so instead ``MemoryTrimmer`` calls
``malloc_trim(0)``:

- once each time the engine goes idle after work;
- every ``busy_interval_s`` under steady load;
- as soon as the resident memory has grown ``growth_limit_mib`` above what it was right
  after the last trim (read from ``/proc/self/statm`` at each tick), so that it stays within
  that bound of the trimmed level between the interval's trims. The limit must exceed one
  step's temporaries (which a trim releases and the next step faults back in), or every tick
  would trim; ``MSTAR_TRIM_GROWTH_MIB`` overrides the default.

Where the C library has no ``malloc_trim`` (not glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

GROWTH_LIMIT_ENV = "MSTAR_TRIM_GROWTH_MIB"
DEFAULT_GROWTH_LIMIT_MIB = 192.0


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


def resident_mib() -> float:
    """This process's resident memory in MiB (0 where ``/proc`` is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def growth_limit_from_env(default: float = DEFAULT_GROWTH_LIMIT_MIB) -> float:
    """``MSTAR_TRIM_GROWTH_MIB`` if set (0 turns the growth trigger off), else ``default``."""
    raw = os.environ.get(GROWTH_LIMIT_ENV)
    if not raw:
        return default
    value = float(raw)
    if value < 0:
        raise ValueError(f"{GROWTH_LIMIT_ENV} must be >= 0, got {raw}")
    return value


class MemoryTrimmer:
    """``tick(steps, running)`` from a loop that runs often (the engine's command loop):
    ``steps`` counts engine steps so far, ``running`` the requests in flight."""

    def __init__(
        self,
        trim: Callable[[], int] | None,
        busy_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        growth_limit_mib: float | None = None,
        rss: Callable[[], float] = resident_mib,
    ) -> None:
        self.trim = trim
        self.busy_interval_s = busy_interval_s
        self.clock = clock
        # None: MSTAR_TRIM_GROWTH_MIB, else the default (what an engine process does).
        self.growth_limit_mib = growth_limit_from_env() if growth_limit_mib is None else growth_limit_mib
        self.rss = rss
        self.trims = 0
        self.growth_trims = 0  # of which the growth bound asked for
        self._steps_at_trim = 0
        self._last_trim = clock()
        self._rss_at_trim = rss() if trim is not None and self.growth_limit_mib > 0 else 0.0

    def tick(self, steps: int, running: int) -> bool:
        """Trim if there was work since the last trim and the engine is now idle, has been
        busy for ``busy_interval_s``, or has grown ``growth_limit_mib`` since the last trim;
        returns whether it trimmed."""
        if self.trim is None or steps == self._steps_at_trim:
            return False
        now = self.clock()
        grown = False
        if running and now - self._last_trim < self.busy_interval_s:
            grown = self.growth_limit_mib > 0 and self.rss() - self._rss_at_trim > self.growth_limit_mib
            if not grown:
                return False
        self.trim()
        self.trims += 1
        self.growth_trims += grown
        self._steps_at_trim, self._last_trim = steps, now
        if self.growth_limit_mib > 0:
            self._rss_at_trim = self.rss()
        log.debug("malloc_trim after step %d (%d running%s)", steps, running, ", grown" if grown else "")
        return True
