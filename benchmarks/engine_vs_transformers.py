"""``mstar.Engine`` vs ``transformers`` ``generate`` on one random Llama checkpoint, in one run.

    .venv/bin/python benchmarks/engine_vs_transformers.py [--requests 32 --layers 8 --hidden 512]

Workload (seeded): ``--requests`` requests with prompts of 16-128 random text tokens and
outputs of 16-256 tokens, greedy, no early stop (``ignore_eos``), all submitted at once.
The checkpoint is written by the Orpheus plugin's writer (Llama, the Orpheus vocabulary of
156,940, not audio-steered, so the engine's codec never runs) and both sides load it. As the
codec never runs, the engine keeps all of torch's threads for the LM (``cpu_threads``; by
default an engine with ``overlap_nodes`` gives each of its two threads half).

- ``mstar.Engine.run_batch`` with all requests (continuous batching);
- ``transformers`` static batch: one left-padded ``generate`` to the longest output;
- ``transformers`` one request at a time, each to its own length.

Throughput is useful tokens per second: the requested outputs, whatever extra steps a
side computes (padding, rows that finished). Printed as ratios to the engine (of wall
time, and of the process's CPU seconds, steadier on a shared machine), then the
share of the engine's run spent in the sampler and ``sampler_cost``'s per-step shares.
``--unpacked`` also runs the engine with ``cpu_packed_linears=False`` (plain ``F.linear``
everywhere, ``mstar.layers.packed_linear``) and prints its ratio to the default engine.
The machine may be shared: run it on a quiet one, and read the numbers as noisy.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from mstar import Engine
from mstar.sampling.multi_sampler import MultiSampler

TEXT_IDS = (1000, 120_000)  # plain text tokens: no special or audio tokens


def workload(n: int, seed: int = 0) -> list[tuple[torch.Tensor, int]]:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(*TEXT_IDS, (rng.randint(16, 128),), generator=gen), rng.randint(16, 256))
        for _ in range(n)
    ]


def write_checkpoint(path: Path, layers: int, hidden: int) -> Path:
    from mstar_orpheus.checkpoint import write_checkpoint as orpheus_checkpoint

    return orpheus_checkpoint(
        path, steer_audio=False, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
        head_dim=hidden // 8, max_position_embeddings=512,
    )


@contextmanager
def sampler_time() -> Iterator[list[float]]:
    """Seconds spent in ``MultiSampler.sample`` while the block runs."""
    spent = [0.0]
    original = MultiSampler.sample

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    MultiSampler.sample = timed  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        MultiSampler.sample = original  # type: ignore[method-assign]


def run_engine(ckpt: Path, work: list[tuple[torch.Tensor, int]], packed: bool = True) -> tuple[float, list[list[int]], float, float]:
    # The codec never runs here, so no forward runs beside the LM's: the engine keeps every
    # torch thread (cpu_threads), as transformers does, instead of halving them for overlap.
    engine = Engine.from_model("orpheus", weights=ckpt, kv_budget_bytes=1 << 30, max_num_seqs=64, cpu_packed_linears=packed,
                               cpu_threads=torch.get_num_threads())

    def request(prompt: torch.Tensor, out: int) -> dict:
        main = {"temperature": 0, "top_p": 1.0, "repetition_penalty": 1.0, "max_tokens": out,
                "ignore_eos": True, "stop_token_ids": []}
        return {"inputs": {"prompt_ids": prompt}, "sampling": {"main": main}}

    try:
        engine.run_batch([request(p, 4) for p, _ in work[:2]])  # warm-up
        with sampler_time() as spent:
            start, cpu = time.perf_counter(), time.process_time()
            results = engine.run_batch([request(p, out) for p, out in work])
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        engine.close()
    tokens = []
    for r, (_, out) in zip(results, work, strict=True):
        assert r.error is None, r.error
        toks = r.cat("token").reshape(-1).tolist()
        assert len(toks) == out, (len(toks), out)
        tokens.append(toks)
    return elapsed, tokens, spent[0] / elapsed, cpu


def load_hf(ckpt: Path):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # no early stop, as ignore_eos
    model.generation_config.pad_token_id = 0
    return model


def hf_static(model, work: list[tuple[torch.Tensor, int]]) -> tuple[float, list[list[int]], float]:
    longest = max(p.numel() for p, _ in work)
    ids = torch.zeros(len(work), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, _) in enumerate(work):  # left padding
        ids[i, longest - p.numel() :] = p
        mask[i, longest - p.numel() :] = 1
    steps = max(out for _, out in work)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return elapsed, [out[i, longest : longest + n].tolist() for i, (_, n) in enumerate(work)], cpu


def hf_one_by_one(model, work: list[tuple[torch.Tensor, int]]) -> tuple[float, list[list[int]], float]:
    tokens = []
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for p, n in work:
            out = model.generate(input_ids=p[None], max_new_tokens=n, min_new_tokens=n, do_sample=False)
            tokens.append(out[0, p.numel() :].tolist())
    return time.perf_counter() - start, tokens, time.process_time() - cpu


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of requests whose greedy outputs agree token for token (float noise can flip
    a near tie, after which a random model's text diverges)."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--skip-one-by-one", action="store_true")
    ap.add_argument("--skip-sampler-cost", action="store_true")
    ap.add_argument("--unpacked", action="store_true", help="also the engine with cpu_packed_linears=False")
    args = ap.parse_args()
    torch.manual_seed(0)
    work = workload(args.requests)
    useful = sum(out for _, out in work)
    print(
        f"Llama {args.layers} layers, hidden {args.hidden}, vocab 156940; {args.requests} requests, prompts "
        f"{min(p.numel() for p, _ in work)}-{max(p.numel() for p, _ in work)}, outputs "
        f"{min(o for _, o in work)}-{max(o for _, o in work)} ({useful} useful tokens); "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as d:
        ckpt = write_checkpoint(Path(d), args.layers, args.hidden)
        eng_s, eng_tokens, sampler_share, eng_cpu = run_engine(ckpt, work)
        print(f"mstar.Engine: {eng_s:.1f} s ({eng_cpu:.1f} CPU s), {useful / eng_s:.1f} tok/s; {sampler_share:.1%} of it in the sampler", flush=True)
        model = load_hf(ckpt)
        hf_static(model, work[:2])  # warm-up
        static_s, static_tokens, static_cpu = hf_static(model, work)
        print(f"transformers static batch: {static_s:.1f} s ({static_cpu:.1f} CPU s), {useful / static_s:.1f} tok/s", flush=True)
        rows = [("transformers static batch", static_s, static_cpu, static_tokens)]
        if args.unpacked:
            plain_s, plain_tokens, _, plain_cpu = run_engine(ckpt, work, packed=False)
            print(f"mstar.Engine, cpu_packed_linears off: {plain_s:.1f} s ({plain_cpu:.1f} CPU s), {useful / plain_s:.1f} tok/s", flush=True)
            rows.append(("engine, packed linears off", plain_s, plain_cpu, plain_tokens))
        if not args.skip_one_by_one:
            single_s, single_tokens, single_cpu = hf_one_by_one(model, work)
            print(f"transformers one at a time: {single_s:.1f} s ({single_cpu:.1f} CPU s), {useful / single_s:.1f} tok/s", flush=True)
            rows.append(("transformers one at a time", single_s, single_cpu, single_tokens))
    # CPU seconds (all threads of this process) beside wall time: on a shared machine the
    # wall clock also counts waiting for the cores.
    print(f"\n{'baseline':>28} | {'engine speed-up':>15} | {'in CPU seconds':>14} | {'same greedy output':>18}")
    for name, seconds, cpu, tokens in rows:
        print(f"{name:>28} | {seconds / eng_s:>14.2f}x | {cpu / eng_cpu:>13.2f}x | {agreement(eng_tokens, tokens):>17.0%}")
    if not args.skip_sampler_cost:
        import sampler_cost

        print("\nsampler cost per decode step (benchmarks/sampler_cost.py):")
        sampler_cost.report(sampler_cost.measure(32, args.layers, args.hidden, repeats=5))


if __name__ == "__main__":
    main()
