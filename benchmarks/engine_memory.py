"""Resident memory of an in-process Orpheus engine under soak-like traffic (batches of 4-32
sampled requests with prompts of 6-32 tokens and 16-96 new tokens), and what the engine
process's ``MemoryTrimmer`` (glibc ``malloc_trim(0)``) does to it and to throughput.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine_memory.py --rounds 24 --trim-each-round
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine_memory.py --rounds 12 --trimmer growth

``--trim-each-round`` tells retention from leaks: a trimmed RSS that keeps growing is live
memory. ``--trimmer off|interval|growth`` runs a thread that ticks a ``MemoryTrimmer`` every
0.1 s while the batches run, as an engine process's command loop does: ``interval`` trims
every 30 s under load (and when idle), ``growth`` also whenever the RSS grew
``--growth-mib`` above its level after the last trim. Each round prints its peak RSS (sampled
every 0.1 s); the last line gives wall and CPU seconds, the range of those peaks and the trims, so variants can be compared (run them
interleaved; the random batches are the same for the same ``--seed``). glibc's own
``MALLOC_MMAP_THRESHOLD_=<bytes>`` environment variable tries the other remedy (large
blocks mmapped, returned at free).
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time

import torch
from mstar import Engine
from mstar.server.memory_trim import MemoryTrimmer, glibc_malloc_trim, resident_mib


def ticking(engine: Engine, trimmer: MemoryTrimmer | None, peak: list[float], stop: threading.Event) -> threading.Thread:
    """Every 0.1 s: the trimmer's tick (if any), then the RSS into ``peak[0]`` (the highest)."""
    core = engine.core

    def run() -> None:
        while not stop.wait(0.1):
            if trimmer is not None:
                trimmer.tick(core.stats.steps, len(core.running) + len(core.waiting))
            peak[0] = max(peak[0], resident_mib())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trim-each-round", action="store_true",
                        help="trim after every round too: a trimmed RSS that keeps growing is live memory (a leak)")
    parser.add_argument("--trimmer", choices=("off", "interval", "growth"), default="off")
    parser.add_argument("--growth-mib", type=float, default=192.0)
    args = parser.parse_args()
    from mstar_orpheus.tokens import OrpheusTokens

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    engine = Engine.from_model("orpheus", random_weights=True)
    tokens = OrpheusTokens.from_dict(engine.built.config["orpheus"])
    rng = random.Random(args.seed)
    print(f"built: {resident_mib():.0f} MiB")
    stop = threading.Event()
    trimmer = None
    if args.trimmer != "off":
        growth = args.growth_mib if args.trimmer == "growth" else 0.0
        trimmer = MemoryTrimmer(glibc_malloc_trim(), growth_limit_mib=growth)
    peak = [0.0]
    ticker = ticking(engine, trimmer, peak, stop)
    peaks: list[float] = []
    wall = 0.0
    cpu0 = time.process_time()
    for r in range(args.rounds):
        batch = []
        for _ in range(rng.randint(4, 32)):
            text = [128000, *(rng.randint(70, 5000) for _ in range(rng.randint(4, 30)))]
            ids = torch.tensor([tokens.start_of_human, *text, *tokens.prompt_suffix])
            sampling = {"main": {"temperature": 1.0, "seed": rng.randint(0, 2**31), "max_tokens": rng.randint(16, 96)}}
            batch.append({"inputs": {"prompt_ids": ids}, "sampling": sampling})
        peak[0] = 0.0
        t0 = time.perf_counter()
        engine.run_batch(batch)
        wall += time.perf_counter() - t0
        peaks.append(max(peak[0], resident_mib()))
        line = f"round {r:2d}: {len(batch):2d} requests in {time.perf_counter() - t0:5.1f} s, peak RSS {peaks[-1]:.0f} MiB"
        if args.trim_each_round:
            MemoryTrimmer(glibc_malloc_trim()).tick(steps=engine.core.stats.steps, running=0)
            line += f", trimmed {resident_mib():.0f} MiB"
        print(line, flush=True)
    cpu = time.process_time() - cpu0
    stop.set()
    ticker.join()
    trims = f"{trimmer.trims} trims ({trimmer.growth_trims} for growth)" if trimmer else "no trimmer"
    print(f"trimmer {args.trimmer}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS per round {min(peaks):.0f}-{max(peaks):.0f} MiB, "
          f"{trims}, load {os.getloadavg()[0]:.2f}", flush=True)
    held = resident_mib()
    MemoryTrimmer(glibc_malloc_trim()).tick(steps=engine.core.stats.steps, running=0)
    print(f"idle, after one MemoryTrimmer tick: {held:.0f} -> {resident_mib():.0f} MiB")
    engine.close()


if __name__ == "__main__":
    main()
