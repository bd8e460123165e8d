"""The engine process's ``MemoryTrimmer``: when it trims, and that a trim returns freed heap
memory to the OS (glibc keeps it otherwise)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mstar.server.memory_trim import MemoryTrimmer, glibc_malloc_trim


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_trims_once_per_idle_period_and_on_an_interval_under_load():
    calls: list[float] = []
    clock = Clock()
    trimmer = MemoryTrimmer(lambda: calls.append(clock.now) or 1, busy_interval_s=30.0, clock=clock)
    assert not trimmer.tick(steps=0, running=0)  # no work yet
    assert not trimmer.tick(steps=5, running=2)  # busy, interval not reached
    assert trimmer.tick(steps=9, running=0)  # went idle after work
    assert not trimmer.tick(steps=9, running=0)  # still idle: nothing new to give back
    clock.now = 10.0
    assert trimmer.tick(steps=10, running=0)
    clock.now = 20.0
    assert not trimmer.tick(steps=20, running=3)  # busy, 10 s since the last trim
    clock.now = 41.0
    assert trimmer.tick(steps=30, running=3)  # busy for a whole interval
    assert calls == [0.0, 10.0, 41.0] and trimmer.trims == 3


def test_without_malloc_trim_it_does_nothing():
    assert not MemoryTrimmer(None).tick(steps=3, running=0)


# A fresh interpreter: fill the heap with freed blocks below a live one (what a large batch
# leaves behind), then tick the trimmer as the engine loop does.
PROBE = """
import os, sys, torch
from mstar.server.memory_trim import MemoryTrimmer, glibc_malloc_trim
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
big = torch.ones(8 << 20, dtype=torch.uint8); del big  # an mmapped free raises glibc's mmap threshold
blocks = [torch.ones(1 << 20, dtype=torch.uint8) for _ in range(300)]
keep = blocks[-1]
del blocks
held = rss()
trim = glibc_malloc_trim() if sys.argv[1] == "trim" else None
MemoryTrimmer(trim).tick(steps=1, running=0)
print(held, rss())
"""


@pytest.mark.skipif(glibc_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
@pytest.mark.parametrize("mode", ["trim", "none"])
def test_a_trim_returns_freed_heap_memory_to_the_os(mode):
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=120)
    held, after = map(float, out.stdout.split())
    if mode == "trim":
        assert after < held - 200, (held, after)  # ~300 MiB of freed blocks go back
    else:
        assert after > held - 20, (held, after)  # glibc keeps them: what the trimmer is for
