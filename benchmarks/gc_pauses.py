"""Python's cyclic garbage collector in an engine's decode loop, with and without the
start-up freeze that ``mstar serve``'s processes apply (``mstar.server.gc_freeze``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gc_pauses.py [--batch 32] [--tokens 128] [--runs 3]

Builds the tiny text LM of ``benchmarks/text_lm_overhead.py`` (random Qwen3 layout, hidden 64,
3 layers) in ``mstar.Engine``, warms it up, then runs ``--runs`` batches of ``--batch``
greedy requests of ``--tokens`` new tokens each, timing every collection through
``gc.callbacks``; then freezes the objects alive and runs the same again. Prints, for each
phase, the collections per generation (count, total ms, largest pause ms), the objects the
collector tracks, and the engine's wall ms per step.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import text_lm_overhead as tlo  # noqa: E402  (the same checkpoint and engine side)


def phase(side: tlo.EngineSide, prompts: torch.Tensor, tokens: int, runs: int) -> dict:
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def timer(event: str, info: dict) -> None:
        if event == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])

    tracked = len(gc.get_objects())
    gc.callbacks.append(timer)
    steps, t0 = 0, time.perf_counter()
    try:
        for _ in range(runs):
            steps += side.run(prompts, tokens).steps
    finally:
        gc.callbacks.remove(timer)
    wall = time.perf_counter() - t0
    return {"tracked": tracked, "steps": steps, "wall_ms_per_step": 1e3 * wall / steps,
            "gc_ms_per_step": 1e3 * sum(sum(p) for p in pauses.values()) / steps,
            "generations": {g: (len(p), 1e3 * sum(p), 1e3 * max(p, default=0.0)) for g, p in pauses.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        ckpt = tlo.write_checkpoint(Path(d), 64, 3, 384, max_len=2 * (32 + args.tokens))
        side = tlo.EngineSide(ckpt, args.batch)
        prompts = torch.randint(0, 380, (args.batch, 32), generator=torch.Generator().manual_seed(0))
        side.run(prompts, 16)  # warm-up
        results = {"as built": phase(side, prompts, args.tokens, args.runs)}
        gc.collect()
        gc.freeze()
        results["frozen"] = phase(side, prompts, args.tokens, args.runs)
        side.close()
    print(f"tiny text LM, batch {args.batch}, {args.runs} x {args.tokens} new tokens, torch threads {torch.get_num_threads()}")
    for name, r in results.items():
        gens = "; ".join(f"gen {g}: {n} x, {total:.1f} ms, max {top:.1f} ms" for g, (n, total, top) in r["generations"].items())
        print(f"{name:>8}: {r['tracked']:>7} tracked objects | {gens} | gc {r['gc_ms_per_step']:.3f} ms/step, "
              f"wall {r['wall_ms_per_step']:.3f} ms/step")


if __name__ == "__main__":
    main()
