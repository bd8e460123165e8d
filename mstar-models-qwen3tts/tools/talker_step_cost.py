"""Cost of the talker's decode step through the engine: aten ops per step (counted by a
TorchDispatchMode; a composite op such as ``rms_norm`` counts once) and the step's thread
CPU time, at ``--rows`` rows on the benchmark's mid-size random checkpoint
(``benchmarks/qwen3tts_tts.py``). Thread CPU time, not wall time, so another process on a
shared machine disturbs it less; the load average is printed before and after.

    OMP_NUM_THREADS=1 .venv/bin/python mstar-models-qwen3tts/tools/talker_step_cost.py [--rows 8] [--frames 40]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from mstar import Engine  # noqa: E402
from mstar_qwen3tts import talker as talker_module  # noqa: E402
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint  # noqa: E402
from qwen3tts_tts import run_mstar  # noqa: E402


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--frames", type=int, default=40, help="frames per request in the timed runs")
    parser.add_argument("--top", type=int, default=12, help="op kinds to list")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("load average before:", os.getloadavg())
    counts: list[collections.Counter[str]] = []
    times: list[float] = []
    mode = {"count": False}
    forward = talker_module.Talker.forward_batched

    def measured(self: Any, graph_walk: str, engine_inputs: Any, input_embeds: torch.Tensor, next_text_ids: torch.Tensor) -> Any:
        # A decode step of every row: one new token per row.
        if not (input_embeds.shape[0] == args.rows == len(engine_inputs.request_ids)):
            return forward(self, graph_walk, engine_inputs, input_embeds, next_text_ids)
        if mode["count"]:
            counter = OpCounter()
            with counter:
                out = forward(self, graph_walk, engine_inputs, input_embeds, next_text_ids)
            counts.append(counter.ops)
            return out
        start = time.thread_time()
        out = forward(self, graph_walk, engine_inputs, input_embeds, next_text_ids)
        times.append(time.thread_time() - start)
        return out

    talker_module.Talker.forward_batched = measured  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(prefix="qwen3tts-step-") as tmp:
        ckpt = write_checkpoint(Path(tmp) / "mid", preset="mid", seed=0)
        engine = Engine.from_model("qwen3tts", weights=ckpt)
        run_mstar(engine, ckpt, 4, 1)  # warm-up
        mode["count"] = True
        run_mstar(engine, ckpt, 4, args.rows)
        mode["count"] = False
        for _ in range(2):
            run_mstar(engine, ckpt, args.frames, args.rows)
        engine.close()
    total: collections.Counter[str] = collections.Counter()
    for c in counts:
        total.update(c)
    print(f"aten ops per decode step at {args.rows} rows: {[sum(c.values()) for c in counts]}")
    for name, n in total.most_common(args.top):
        print(f"  {name:<32} {n / len(counts):8.1f}")
    times.sort()
    print(f"talker decode step, thread CPU ms at {args.rows} rows: median {1000 * statistics.median(times):.1f}, "
          f"p10 {1000 * times[len(times) // 10]:.1f}, p90 {1000 * times[9 * len(times) // 10]:.1f} ({len(times)} steps)")
    print("load average after:", os.getloadavg())


if __name__ == "__main__":
    main()
