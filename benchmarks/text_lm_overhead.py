"""Text LM overhead: a tiny text-only LM served by ``mstar.Engine`` vs a plain ``transformers``
decode loop on the same checkpoint, at batch 1, 8 and 32, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/text_lm_overhead.py --rounds 3 \
        --json benchmarks/results/text_lm_overhead_2026-12-04.json
    # also OMP_NUM_THREADS=2; options (defaults): --batches 1,8,32 --prompt 32 --tokens 64
    #   --hidden 64 --layers 3 --vocab 384 --no-check

The checkpoint is a random Qwen3ForCausalLM (hidden 64, 3 layers by default) written by
``transformers``' ``save_pretrained`` into a temporary directory: config.json and
model.safetensors with HF's keys, the layout a real checkpoint has. Both sides load it in
float32 and run with the same torch threads (``OMP_NUM_THREADS``), on the same thread.

- engine: the core's text LLM (``mstar.text.lm``'s graph and ``CausalLMNode``) as the
  fixture plugin ``tests/fixtures/plugins/qwen3_text`` declares it (loaded from that folder
  through core's own plugin loader, nothing installed), built with the engine's CPU defaults
  (oneDNN-packed linears for weights of at least 65,536 elements: none at the default size,
  so both sides run plain ``F.linear``). Every row of the batch is submitted at once with
  ``Engine.run_batch``: greedy, ``ignore_eos``, ``max_tokens`` = ``--tokens``.
- transformers: ``model(prompt, past_key_values=DynamicCache())`` for the prefill, then one
  forward per new token on the cache and an argmax (no ``generate``): the same batch, prompts
  (equal length, so no padding), number of new tokens and dtype.

Each ``--rounds`` round runs both sides on fresh prompts, alternating which goes first; the
table prints medians over rounds (the ratio: the median of each round's engine/transformers
ratio, paired, so a machine that speeds up or slows down between rounds moves it less):

- tok/s: batch x new tokens / wall time of the whole run (prefill included);
- engine host ms/step: (engine wall time - time inside the LM node's ``forward_batched``) /
  the engine's forwards (``engine.core.stats.steps``): what the engine spends per step outside
  the model (scheduling, batch and attention metadata building, output handling, streams).
  The sampler runs inside ``forward_batched`` (``mstar.text.lm.sample_step``), so it counts as
  model time here; its own time per step is in the JSON (``engine_sampler_ms_per_step``);
- transformers ms/step: transformers wall time / its forwards (one per new token).

Unless ``--no-check``, every round asserts that the engine's greedy tokens equal the
transformers loop's for every row, so both sides did the same work. ``--json PATH`` writes
the per-round figures, the medians, the machine and its load average.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "plugins" / "qwen3_text"


def write_checkpoint(path: Path, hidden: int, layers: int, vocab: int, max_len: int) -> Path:
    """A random Qwen3ForCausalLM in HF's own layout (``save_pretrained``)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    heads = 4
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=hidden // heads,
        max_position_embeddings=max_len, rms_norm_eps=1e-6, tie_word_embeddings=False,
        # HF's default 0.02 leaves a random model's logits nearly flat, where float noise
        # between two kernels can flip a greedy pick; wider weights keep the check meaningful.
        initializer_range=0.1, eos_token_id=vocab - 1, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # norms away from 1, so both sides must apply every norm alike
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return path


def load_text_plugin() -> Any:
    """The fixture text LLM plugin through core's loader, straight from its source folder."""
    from mstar.plugins.discovery import InstalledModel
    from mstar.plugins.loading import ModelLoader

    sys.path.insert(0, str(FIXTURE))
    installed = InstalledModel(
        name="tinyqwen3", distribution="mstar-fixture-qwen3_text", version="0.1.0", aliases=(),
        architectures=("Qwen3ForCausalLM",), entry_point="fixture_qwen3.plugin", plugin_api=("1.1",),
    )
    return ModelLoader(installed).load()


class Stopwatch:
    """Seconds spent inside ``owner.name(...)`` (an instance attribute shadows the method)."""

    def __init__(self, owner: object, name: str) -> None:
        self.seconds = 0.0
        self.thread_seconds = 0.0  # this thread's CPU time: what the machine's load does not add
        original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.thread_seconds += time.thread_time() - cpu

        setattr(owner, name, timed)


@dataclass
class Run:
    seconds: float
    steps: int  # forwards
    tokens: list[list[int]]
    cpu_seconds: float = 0.0  # the process's CPU time, all threads
    thread_seconds: float = 0.0  # the calling thread's CPU time (it steps the engine)
    model_seconds: float = 0.0  # engine: inside the LM node's forward_batched
    model_thread_seconds: float = 0.0  # the same in this thread's CPU time
    sampler_seconds: float = 0.0  # engine: inside the sampler (part of model_seconds)


class EngineSide:
    def __init__(self, ckpt: Path, max_rows: int) -> None:
        from mstar import Engine
        from mstar.engine.builder import EngineConfig, build_core

        loaded = load_text_plugin()
        # cpu_threads: the same torch threads as transformers gets (the default already is,
        # without overlap_nodes; said here so the comparison does not hang on a default).
        config = EngineConfig(max_num_seqs=max(64, max_rows), cpu_threads=torch.get_num_threads(), dtype="float32")
        self.engine = Engine(build_core(loaded, ckpt, config), loaded, ckpt)
        node = self.engine.core.nodes["lm"]
        self.forward = Stopwatch(node.submodule, "forward_batched")
        self.sampler = Stopwatch(node.sampler, "sample") if node.sampler is not None else None

    def run(self, prompts: torch.Tensor, tokens: int) -> Run:
        sampling = {"temperature": 0, "max_tokens": tokens, "ignore_eos": True}
        reqs = [{"inputs": {"prompt_ids": p}, "sampling": sampling} for p in prompts]
        stats = self.engine.core.stats
        steps, forward_s, forward_cpu = stats.steps, self.forward.seconds, self.forward.thread_seconds
        sampler_s = self.sampler.seconds if self.sampler is not None else 0.0
        start, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        results = self.engine.run_batch(reqs)  # steps on this thread: no loop thread was started
        elapsed, cpu, thread = time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - thread
        out = []
        for r in results:
            assert r.error is None, f"engine request failed: {r.error}"
            out.append(r.cat("tokens").tolist())
            assert len(out[-1]) == tokens, f"engine gave {len(out[-1])} tokens, asked for {tokens} ({r.finish_reason})"
        return Run(
            elapsed, stats.steps - steps, out, cpu, thread, self.forward.seconds - forward_s,
            self.forward.thread_seconds - forward_cpu, (self.sampler.seconds if self.sampler is not None else 0.0) - sampler_s,
        )

    def close(self) -> None:
        self.engine.close()


class TransformersSide:
    def __init__(self, ckpt: Path) -> None:
        from transformers import Qwen3ForCausalLM

        self.model = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()

    def run(self, prompts: torch.Tensor, tokens: int) -> Run:
        from transformers import DynamicCache

        start, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config)
            # logits_to_keep=1: only the last position's logits, as the engine computes.
            logits = self.model(input_ids=prompts, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            nxt = logits[:, -1].argmax(-1)
            picked = [nxt]
            for _ in range(tokens - 1):
                logits = self.model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True).logits
                nxt = logits[:, -1].argmax(-1)
                picked.append(nxt)
            out = torch.stack(picked, 1)
        elapsed, cpu, thread = time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - thread
        return Run(elapsed, tokens, out.tolist(), cpu, thread)


def check_same(engine: Run, hf: Run, batch: int, round_: int) -> None:
    for row, (e, h) in enumerate(zip(engine.tokens, hf.tokens, strict=True)):
        if e != h:
            at = next(i for i, (a, b) in enumerate(zip(e, h, strict=True)) if a != b)
            raise AssertionError(
                f"batch {batch}, round {round_}, row {row}: the engine's greedy tokens differ from the "
                f"transformers loop's from new token {at} on (engine {e[at:at + 5]}..., transformers {h[at:at + 5]}...); "
                "the two sides did not do the same work (--no-check skips this check)"
            )


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        return platform.processor() or "unknown"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def uncommitted(path: str) -> list[str]:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", path], capture_output=True, text=True, cwd=REPO, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:] for line in out.splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per batch; medians are printed")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens per row")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per row")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--no-check", action="store_true", help="do not assert equal greedy tokens")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--gc-freeze", action="store_true", help="once both sides are built, keep every object then "
                    "alive out of the cyclic garbage collector, as mstar serve's processes do (mstar.server.gc_freeze)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # before transformers loads: no bars in the table
    # transformers 5.x renames past_key_values to cache; the loop keeps the name every release
    # accepts, so the rename's warning is noise here.
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
    batches = [int(x) for x in args.batches.split(",")]
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    threads = torch.get_num_threads()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        ckpt = write_checkpoint(Path(d), args.hidden, args.layers, args.vocab, max_len=2 * (args.prompt + args.tokens))
        hf = TransformersSide(ckpt)
        engine = EngineSide(ckpt, max(batches))
        if args.gc_freeze:
            from mstar.server.gc_freeze import freeze_startup_objects

            freeze_startup_objects("benchmark")
        print(
            f"Qwen3 layout: {args.layers} layers, hidden {args.hidden}, vocabulary {args.vocab}; prompt {args.prompt}, "
            f"{args.tokens} new tokens, greedy, float32; torch threads {threads}; {cpu_model()}",
            flush=True,
        )
        head = ("batch", "transformers tok/s", "engine tok/s", "engine/transformers", "engine host ms/step", "transformers ms/step", "load (1 min)")
        print(" | ".join(head), flush=True)
        try:
            for b in batches:
                gen = torch.Generator().manual_seed(b)
                warm = torch.randint(0, args.vocab, (b, args.prompt), generator=gen)
                engine.run(warm, 4)  # warm-up at this batch's shapes (oneDNN primitives, caches)
                hf.run(warm, 4)
                rounds = []
                for i in range(args.rounds):
                    prompts = torch.randint(0, args.vocab, (b, args.prompt), generator=gen)
                    sides: list[tuple[str, Callable[[torch.Tensor, int], Run]]] = [("hf", hf.run), ("engine", engine.run)]
                    done = {name: fn(prompts, args.tokens) for name, fn in (sides if i % 2 == 0 else sides[::-1])}
                    e, h = done["engine"], done["hf"]
                    if not args.no_check:
                        check_same(e, h, b, i)
                    tokens = b * args.tokens
                    rounds.append({
                        "first": "transformers" if i % 2 == 0 else "engine",
                        "transformers_tok_s": tokens / h.seconds,
                        "engine_tok_s": tokens / e.seconds,
                        "ratio": h.seconds / e.seconds,
                        "ratio_cpu_seconds": h.cpu_seconds / e.cpu_seconds,
                        "engine_host_ms_per_step": 1e3 * (e.seconds - e.model_seconds) / e.steps,
                        "engine_host_cpu_ms_per_step": 1e3 * (e.thread_seconds - e.model_thread_seconds) / e.steps,
                        "engine_model_ms_per_step": 1e3 * e.model_seconds / e.steps,
                        "engine_sampler_ms_per_step": 1e3 * e.sampler_seconds / e.steps,
                        "transformers_ms_per_step": 1e3 * h.seconds / h.steps,
                        "engine_steps": e.steps,
                        "transformers_steps": h.steps,
                        "engine_s": e.seconds,
                        "transformers_s": h.seconds,
                        "engine_cpu_s": e.cpu_seconds,
                        "transformers_cpu_s": h.cpu_seconds,
                        "same_tokens": e.tokens == h.tokens,
                    })
                med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if isinstance(rounds[0][k], float)}
                load = os.getloadavg()[0]  # as this batch's rounds ended: shared cores skew wall time
                rows.append({"batch": b, "median": med, "rounds": rounds, "load_1min": load})
                print(
                    f"{b:>5} | {med['transformers_tok_s']:>18.1f} | {med['engine_tok_s']:>12.1f} | {med['ratio']:>19.2f} | "
                    f"{med['engine_host_ms_per_step']:>19.3f} | {med['transformers_ms_per_step']:>20.3f} | {load:.2f}",
                    flush=True,
                )
        finally:
            engine.close()
    if args.json:
        result = {
            "benchmark": "text_lm_overhead",
            "started_utc": started.isoformat(timespec="seconds"),
            "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "gc_freeze": args.gc_freeze,
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "torch_threads": threads,
            "load_before": list(load_before),
            "load_after": list(os.getloadavg()),
            "git_commit": git_commit(),
            # The engine measured is the working tree's: uncommitted core edits count.
            "uncommitted_core_files": uncommitted("mstar-core/src"),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "model": {"layout": "Qwen3ForCausalLM", "hidden": args.hidden, "layers": args.layers, "vocab": args.vocab, "dtype": "float32"},
            "workload": {"prompt": args.prompt, "new_tokens": args.tokens, "rounds": args.rounds, "checked": not args.no_check},
            "rows": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
