"""Sampler cost per decode step: the share of a batch-32 decode step spent sampling, at the
Orpheus vocabulary (156,940), for greedy, top-k 50 and top-p 0.9, in one run.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/sampler_cost.py [--batch 32 --layers 8 --hidden 512 --repeats 9]

The decode step's model part is one forward of a random ``transformers`` Llama (8 layers,
hidden 512, the Orpheus vocabulary) for one new token per row over a 64-token KV cache;
the sampling part is ``mstar.sampling.SlotSampler.sample`` (the sampler the
engine binds) on logits shaped like a language model's: an N(0, 2.5^2) background with
eight tokens per row boosted by 12 to 24, so most rows put most of their mass on a few
tokens (the top-p 0.9 nucleus sizes are printed). Model and sampler calls are interleaved
and medians reported, because the machine may be shared (the load average is printed
before and after); the share is sampler / (model + sampler), by wall clock and by CPU
seconds of the process (all threads), which moves less with the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from mstar.sampling import SamplingParams, SlotSampler

VOCAB = 156_940
SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "top-k 50": SamplingParams(temperature=1.0, top_k=50),
    "top-p 0.9": SamplingParams(temperature=1.0, top_p=0.9),
}


def peaked_logits(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """LM-like rows: an N(0, 2.5^2) background and eight tokens boosted by 12 to 24."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, vocab, generator=gen) * 2.5
    hot = torch.randint(0, vocab, (batch, 8), generator=gen)
    return x.scatter_add(1, hot, torch.rand(batch, 8, generator=gen) * 12 + 12)


def nucleus_sizes(logits: torch.Tensor, top_p: float) -> list[int]:
    p = torch.softmax(logits.double(), dim=1).sort(dim=1, descending=True).values
    return sorted(((p.cumsum(dim=1) - p) < top_p).sum(dim=1).tolist())


def make_sampler(params: SamplingParams, batch: int, vocab: int) -> Callable[[torch.Tensor], object]:
    sampler = SlotSampler(batch, vocab)
    for slot in range(batch):
        sampler.add_request(slot, params, seed=1000 + slot)
    slots = torch.arange(batch)
    return lambda logits: sampler.sample(logits, slots)


def make_model_step(batch: int, layers: int, hidden: int, context: int) -> Callable[[], object]:
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, VOCAB, (batch, context))
    with torch.inference_mode():
        cache = DynamicCache(config=cfg)
        model(ids, past_key_values=cache, use_cache=True)
    token = torch.randint(0, VOCAB, (batch, 1))
    position = torch.full((batch, 1), context)

    def step() -> object:
        with torch.inference_mode():
            out = model(token, past_key_values=cache, position_ids=position, use_cache=True, logits_to_keep=1)
        cache.crop(-1)  # the next repeat decodes at the same length
        return out.logits

    return step


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall s, CPU s of the process, all threads) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


Times = tuple[float, float]  # median (wall, CPU) seconds


def median(samples: list[tuple[float, float]]) -> Times:
    return statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)


def measure(batch: int, layers: int, hidden: int, repeats: int) -> dict[str, tuple[Times, Times]]:
    """{setting: (model step, sampler)} median times, measured interleaved."""
    step = make_model_step(batch, layers, hidden, context=64)
    logits = peaked_logits(batch, VOCAB)
    samplers = {name: make_sampler(p, batch, VOCAB) for name, p in SETTINGS.items()}
    step()
    for s in samplers.values():
        s(logits)
    model_t: list[tuple[float, float]] = []
    sample_t: dict[str, list[tuple[float, float]]] = {name: [] for name in samplers}
    for _ in range(repeats):
        model_t.append(timed(step))
        for name, s in samplers.items():
            sample_t[name].append(timed(lambda s=s: s(logits)))
    model = median(model_t)
    return {name: (model, median(t)) for name, t in sample_t.items()}


def report(results: dict[str, tuple[Times, Times]]) -> None:
    print("share of step = sampler / (model step + sampler), by wall clock and by CPU seconds")
    print(f"{'setting':>10} | {'model ms':>8} | {'sample ms':>9} | {'share':>6} | "
          f"{'model CPU ms':>12} | {'sample CPU ms':>13} | {'CPU share':>9}")
    for name, ((model, model_cpu), (sample, sample_cpu)) in results.items():
        print(f"{name:>10} | {model * 1e3:>8.1f} | {sample * 1e3:>9.2f} | {sample / (model + sample):>6.1%} | "
              f"{model_cpu * 1e3:>12.1f} | {sample_cpu * 1e3:>13.2f} | {sample_cpu / (model_cpu + sample_cpu):>9.1%}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.manual_seed(0)
    sizes = nucleus_sizes(peaked_logits(args.batch, VOCAB), 0.9)
    print(
        f"vocab {VOCAB}, batch {args.batch}, Llama {args.layers} layers hidden {args.hidden}, "
        f"torch threads {torch.get_num_threads()}; top-p 0.9 nucleus sizes: median "
        f"{sizes[len(sizes) // 2]}, max {sizes[-1]}"
    )
    print(f"load average before: {load_average()}")
    report(measure(args.batch, args.layers, args.hidden, args.repeats))
    print(f"load average after: {load_average()}")


def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


if __name__ == "__main__":
    main()
