"""The engine process's ``MemoryTrimmer``: when it trims, and that a trim returns freed heap
memory to the OS (glibc keeps it otherwise)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mstar.server.memory_trim import (
    DEFAULT_GROWTH_LIMIT_MIB,
    GROWTH_LIMIT_ENV,
    MemoryTrimmer,
    glibc_malloc_trim,
    growth_limit_from_env,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_trims_once_per_idle_period_and_on_an_interval_under_load():
    calls: list[float] = []
    clock = Clock()
    trimmer = MemoryTrimmer(lambda: calls.append(clock.now) or 1, busy_interval_s=30.0, clock=clock, growth_limit_mib=0)
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


def test_trims_under_load_once_memory_grew_past_the_limit_since_the_last_trim():
    clock, rss = Clock(), [700.0]
    calls: list[float] = []

    def trim() -> int:
        calls.append(rss[0])
        rss[0] = 720.0  # what the trim gave back; the new level the limit counts from
        return 1

    trimmer = MemoryTrimmer(trim, busy_interval_s=30.0, clock=clock, growth_limit_mib=100.0, rss=lambda: rss[0])
    rss[0] = 790.0
    assert not trimmer.tick(steps=1, running=4)  # +90 over the 700 at the start
    rss[0] = 801.0
    assert trimmer.tick(steps=2, running=4)  # +101
    rss[0] = 815.0
    assert not trimmer.tick(steps=3, running=4)  # +95 over the 720 after the trim
    rss[0] = 821.0
    assert trimmer.tick(steps=4, running=4)
    assert not trimmer.tick(steps=4, running=4)  # no step since: nothing new to give back
    assert calls == [801.0, 821.0] and trimmer.trims == trimmer.growth_trims == 2
    rss[0] = 2000.0
    assert not MemoryTrimmer(trim, clock=clock, growth_limit_mib=0, rss=lambda: rss[0]).tick(steps=1, running=4)  # 0: off


def test_growth_limit_from_the_environment(monkeypatch):
    monkeypatch.delenv(GROWTH_LIMIT_ENV, raising=False)
    assert MemoryTrimmer(None).growth_limit_mib == DEFAULT_GROWTH_LIMIT_MIB
    monkeypatch.setenv(GROWTH_LIMIT_ENV, "64")
    assert MemoryTrimmer(None).growth_limit_mib == 64.0
    assert MemoryTrimmer(None, growth_limit_mib=10).growth_limit_mib == 10.0  # an explicit value wins
    monkeypatch.setenv(GROWTH_LIMIT_ENV, "-1")
    with pytest.raises(ValueError, match=GROWTH_LIMIT_ENV):
        growth_limit_from_env()


def test_without_malloc_trim_it_does_nothing():
    assert not MemoryTrimmer(None).tick(steps=3, running=0)


# A fresh interpreter: fill the heap with freed blocks below a live one (what a large batch
# leaves behind), then tick the trimmer as the engine loop does: idle, or still busy with a
# growth limit (100 MiB, below the ~300 MiB held) or without one.
PROBE = """
import sys, torch
from mstar.server.memory_trim import MemoryTrimmer, glibc_malloc_trim, resident_mib
mode = sys.argv[1]
trimmer = MemoryTrimmer(None if mode == "none" else glibc_malloc_trim(), growth_limit_mib=100.0 if mode == "growth" else 0.0)
big = torch.ones(8 << 20, dtype=torch.uint8); del big  # an mmapped free raises glibc's mmap threshold
blocks = [torch.ones(1 << 20, dtype=torch.uint8) for _ in range(300)]
keep = blocks[-1]
del blocks
held = resident_mib()
trimmer.tick(steps=1, running=0 if mode in ("idle", "none") else 8)
print(held, resident_mib())
"""


@pytest.mark.skipif(glibc_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
@pytest.mark.parametrize("mode", ["idle", "growth", "none", "busy"])
def test_a_trim_returns_freed_heap_memory_to_the_os(mode):
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=120)
    held, after = map(float, out.stdout.split())
    if mode in ("idle", "growth"):
        assert after < held - 200, (held, after)  # ~300 MiB of freed blocks go back
    else:  # no trimmer, or busy without a growth limit and before the 30 s interval
        assert after > held - 20, (held, after)  # glibc keeps them: what the trimmer is for
