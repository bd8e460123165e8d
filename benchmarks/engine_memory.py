"""Resident memory of an in-process Orpheus engine under soak-like traffic (batches of 4-24
sampled requests with prompts of 6-32 tokens and 16-96 new tokens), then after one
``MemoryTrimmer`` tick (glibc ``malloc_trim(0)``): how much of the rise was freed heap that
glibc kept rather than live memory.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine_memory.py --rounds 14
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine_memory.py --rounds 24 --trim-each-round

The second form tells retention from leaks: on 2026-12-01 (2-core machine, shared) the
trimmed RSS went 737 MiB (round 0) -> 761 MiB (round 11) and then stayed within 756-773 MiB
to round 23 (385 requests), while the untrimmed RSS moved between 794 and 994 MiB.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
from mstar import Engine
from mstar.server.memory_trim import MemoryTrimmer, glibc_malloc_trim


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trim-each-round", action="store_true",
                        help="trim after every round too: a trimmed RSS that keeps growing is live memory (a leak)")
    args = parser.parse_args()
    from mstar_orpheus.tokens import OrpheusTokens

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    engine = Engine.from_model("orpheus", random_weights=True)
    tokens = OrpheusTokens.from_dict(engine.built.config["orpheus"])
    rng = random.Random(args.seed)
    print(f"built: {rss_mib():.0f} MiB")
    for r in range(args.rounds):
        batch = []
        for _ in range(rng.randint(4, 24)):
            text = [128000, *(rng.randint(70, 5000) for _ in range(rng.randint(4, 30)))]
            ids = torch.tensor([tokens.start_of_human, *text, *tokens.prompt_suffix])
            sampling = {"main": {"temperature": 1.0, "seed": rng.randint(0, 2**31), "max_tokens": rng.randint(16, 96)}}
            batch.append({"inputs": {"prompt_ids": ids}, "sampling": sampling})
        t0 = time.perf_counter()
        engine.run_batch(batch)
        line = f"round {r:2d}: {len(batch):2d} requests in {time.perf_counter() - t0:5.1f} s, RSS {rss_mib():.0f} MiB"
        if args.trim_each_round:
            MemoryTrimmer(glibc_malloc_trim()).tick(steps=engine.core.stats.steps, running=0)
            line += f", trimmed {rss_mib():.0f} MiB"
        print(line, flush=True)
    held = rss_mib()
    MemoryTrimmer(glibc_malloc_trim()).tick(steps=engine.core.stats.steps, running=0)
    print(f"idle, after one MemoryTrimmer tick: {held:.0f} -> {rss_mib():.0f} MiB")
    engine.close()


if __name__ == "__main__":
    main()
