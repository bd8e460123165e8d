"""Prefix caching on vs off (issue #38's targets): two ``mstar.Engine`` on one random Llama
checkpoint, float32, CPU, one with ``prefix_caching=True``, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prefix_caching.py --rounds 3 \
        [--json benchmarks/results/prefix_caching_<date>.json --layers 4 --hidden 256 --no-check]

The checkpoint is written by the Orpheus plugin's writer, as in
``benchmarks/engine_vs_transformers.py`` (Llama, vocabulary 156,940, not audio-steered, so
the codec never runs; here 4 layers, hidden 256, 8 heads, 4 KV heads, positions up to
2,048). At that size a 1,000-token prefill costs several batch-32 decode steps (the script
prints both, measured on the "off" engine), so the prompt is most of a chat's work, as in a
real model. Both engines are built alike (``kv_budget_bytes`` 1 GiB, ``max_num_seqs`` 64,
the default 2,048-token step budget and 16-position blocks, every torch thread for the LM:
``cpu_threads``); all requests are greedy, ``ignore_eos``, random text token ids.
``--no-mixed-batches`` builds both with ``mixed_batches=False`` (prefill chunks and decode
rows in separate steps): CPU's torch attention pads every row of a step to its longest
query, so a step mixing a 1,000-token prefill chunk with decode rows costs far more than
its tokens; this shows how much of the "off" cost that is.

1. chat: a 1,000-token system prompt shared by 32 requests, each that prefix + its own
   16-24-token question, ``--chat-tokens`` (16) new tokens, all submitted at once
   (``Engine.run_batch``). TTFT: from the ``run_batch`` call to the moment the request's
   first token reaches its output queue (the request's sink notes the time of its first
   ``token`` output; the engine hands outputs out after every step). p50 / p90 over the 32
   requests, and the wall time of the batch. With caching on, twice: "first wave" (the
   prefix is not cached yet; requests scheduled after the first prefill chunk of the
   prefix has run can already map it) and "warm" (another 1,000-token prefix, sent first
   in one request with another question, as a server's first chat would, then the 32).
   The off engine runs both sets of 32, and each on figure is paired with the off run of
   the same requests. Ratios are off / on (higher: caching helps).
2. distinct: 32 different 1,000-token prompts, nothing shared, 16 new tokens each, at
   once: throughput ((prompt + new tokens) / wall) and the on / off ratios of wall time
   and of the process's CPU seconds (above 1: caching costs that much).
3. conversation: 6 turns; turn 1 is a 1,000-token system prompt + a 30-token user
   message; each later turn is the previous prompt + its answer (``--chat-tokens`` tokens)
   + a new 30-token message, one request at a time. Per turn: the prompt length and the
   prompt positions computed, i.e. prompt length minus the positions taken from the cache
   (the turn's delta of ``engine.core.stats.prefix_hit_tokens``), and the turn's wall time.

Every round uses fresh random prompts (seeded by the round), so the on engine's cache
holds nothing of a round's prompts when it starts; what earlier rounds cached stays
(evicted LRU when space is needed), as on a server. ``--rounds N`` interleaves on and off,
alternating which runs first in each scenario, and prints medians over rounds (ratios:
the median of each round's paired ratio). Unless ``--no-check``, it asserts that every
request's greedy tokens are equal on and off. ``--json PATH`` writes the per-round
figures, the medians, the machine, the torch threads and the load average.
The machine may be shared: read the wall-clock numbers with the load printed beside them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from mstar import Engine
from mstar.engine.request import RequestOutput

TEXT_IDS = (1000, 120_000)  # plain text tokens of the Orpheus vocabulary: no special or audio ids
REQUESTS = 32
PREFIX = 1000
DISTINCT_PROMPT = 1000
TURNS = 6
USER_MESSAGE = 30


class TimedSink:
    """One request's output queue for ``run_batch``, noting when its first token arrived."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[RequestOutput] = queue.SimpleQueue()
        self.first_token: float | None = None

    def put(self, out: RequestOutput) -> None:
        if self.first_token is None and out.signal == "token" and out.data is not None:
            self.first_token = time.perf_counter()
        self._queue.put(out)

    def get(self) -> RequestOutput:
        return self._queue.get()


@dataclass
class BatchRun:
    wall_s: float
    cpu_s: float
    ttft_ms: list[float]
    prompt_tokens: int
    hit_tokens: int  # prompt positions taken from the prefix cache
    tokens: list[list[int]] = field(repr=False)

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.hit_tokens


def sampling(max_tokens: int) -> dict[str, Any]:
    main = {"temperature": 0, "top_p": 1.0, "repetition_penalty": 1.0, "max_tokens": max_tokens,
            "ignore_eos": True, "stop_token_ids": []}
    return {"main": main}


def run_batch(engine: Engine, prompts: list[list[int]], max_tokens: int) -> BatchRun:
    """All ``prompts`` submitted at once; per request the time to its first token."""
    sinks = [TimedSink() for _ in prompts]
    requests = [
        {"inputs": {"prompt_ids": torch.tensor(p)}, "sampling": sampling(max_tokens), "_sink": s}
        for p, s in zip(prompts, sinks, strict=True)
    ]
    hits = engine.core.stats.prefix_hit_tokens
    start, cpu = time.perf_counter(), time.process_time()
    results = engine.run_batch(requests)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = []
    for r in results:
        assert r.error is None, r.error
        toks = r.cat("token").reshape(-1).tolist()
        assert len(toks) == max_tokens, (len(toks), max_tokens)
        tokens.append(toks)
    ttft = []
    for s in sinks:
        assert s.first_token is not None
        ttft.append((s.first_token - start) * 1e3)
    return BatchRun(wall, cpu, ttft, sum(len(p) for p in prompts), engine.core.stats.prefix_hit_tokens - hits, tokens)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TEXT_IDS) for _ in range(n)]


def write_checkpoint(path: Path, layers: int, hidden: int) -> Path:
    from mstar_orpheus.checkpoint import write_checkpoint as orpheus_checkpoint

    return orpheus_checkpoint(
        path, steer_audio=False, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
        head_dim=hidden // 8, max_position_embeddings=2048,
    )


def build(ckpt: Path, prefix_caching: bool, mixed_batches: bool = True) -> Engine:
    # The codec never runs, so the LM gets every torch thread (as engine_vs_transformers.py).
    return Engine.from_model("orpheus", weights=ckpt, prefix_caching=prefix_caching, kv_budget_bytes=1 << 30,
                             max_num_seqs=64, cpu_threads=torch.get_num_threads(), mixed_batches=mixed_batches)


def check_equal(a: list[list[int]], b: list[list[int]], what: str, enabled: bool) -> bool:
    same = a == b
    if not same:
        bad = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        msg = f"{what}: greedy tokens differ on vs off for requests {bad}"
        if enabled:
            raise AssertionError(msg)
        print("WARNING:", msg, flush=True)
    return same


def chat_round(on: Engine, off: Engine, rng: random.Random, on_first: bool, new_tokens: int, check: bool) -> dict[str, Any]:
    prefix_a, prefix_b = random_ids(rng, PREFIX), random_ids(rng, PREFIX)
    questions = [random_ids(rng, rng.randint(16, 24)) for _ in range(REQUESTS)]
    warm_question = random_ids(rng, 20)
    first_wave = [prefix_a + q for q in questions]
    warm = [prefix_b + q for q in questions]
    runs: dict[str, BatchRun] = {}

    def run_on() -> None:
        runs["on_first"] = run_batch(on, first_wave, new_tokens)
        run_batch(on, [prefix_b + warm_question], new_tokens)  # the server's first chat
        runs["on_warm"] = run_batch(on, warm, new_tokens)

    def run_off() -> None:
        runs["off_first"] = run_batch(off, first_wave, new_tokens)
        runs["off_warm"] = run_batch(off, warm, new_tokens)

    for fn in (run_on, run_off) if on_first else (run_off, run_on):
        fn()
    out: dict[str, Any] = {}
    for name, r in runs.items():
        out[name] = {"ttft_p50_ms": percentile(r.ttft_ms, 0.5), "ttft_p90_ms": percentile(r.ttft_ms, 0.9),
                     "wall_s": r.wall_s, "cpu_s": r.cpu_s, "prompt_tokens": r.prompt_tokens,
                     "computed_tokens": r.computed, "ttft_ms": r.ttft_ms}
    for wave in ("first", "warm"):
        off_r, on_r = out[f"off_{wave}"], out[f"on_{wave}"]
        out[f"ratio_{wave}"] = {k: off_r[k] / on_r[k] for k in ("ttft_p50_ms", "ttft_p90_ms", "wall_s", "cpu_s")}
        out[f"identical_{wave}"] = check_equal(runs[f"on_{wave}"].tokens, runs[f"off_{wave}"].tokens, f"chat {wave}", check)
    return out


def distinct_round(on: Engine, off: Engine, rng: random.Random, on_first: bool, new_tokens: int, check: bool) -> dict[str, Any]:
    prompts = [random_ids(rng, DISTINCT_PROMPT) for _ in range(REQUESTS)]
    runs = {}
    for name in ("on", "off") if on_first else ("off", "on"):
        runs[name] = run_batch(on if name == "on" else off, prompts, new_tokens)
    total = sum(len(p) for p in prompts) + new_tokens * len(prompts)
    out: dict[str, Any] = {
        name: {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "tok_per_s": total / r.wall_s, "hit_tokens": r.hit_tokens}
        for name, r in runs.items()
    }
    out["on_over_off_wall"] = runs["on"].wall_s / runs["off"].wall_s
    out["on_over_off_cpu"] = runs["on"].cpu_s / runs["off"].cpu_s
    out["identical"] = check_equal(runs["on"].tokens, runs["off"].tokens, "distinct", check)
    return out


def conversation_round(on: Engine, off: Engine, rng: random.Random, on_first: bool, new_tokens: int, check: bool) -> dict[str, Any]:
    system = random_ids(rng, PREFIX)
    messages = [random_ids(rng, USER_MESSAGE) for _ in range(TURNS)]
    out: dict[str, Any] = {}
    answers: dict[str, list[list[int]]] = {}
    for name in ("on", "off") if on_first else ("off", "on"):
        engine = on if name == "on" else off
        prompt = list(system)
        turns = []
        answers[name] = []
        for t in range(TURNS):
            if t:
                prompt += answers[name][-1]
            prompt += messages[t]
            r = run_batch(engine, [prompt], new_tokens)
            answers[name].append(r.tokens[0])
            turns.append({"prompt_tokens": r.prompt_tokens, "computed_tokens": r.computed, "wall_ms": r.wall_s * 1e3})
        out[name] = turns
    out["identical"] = check_equal(answers["on"], answers["off"], "conversation", check)
    return out


def decode_vs_prefill(engine: Engine, rng: random.Random) -> dict[str, float]:
    """What a 1,000-token prefill and a batch-32 decode step cost on this engine (ms)."""
    prompt = random_ids(rng, PREFIX)
    one = run_batch(engine, [prompt], 1)  # one step (within the 2,048-token budget): prefill and sample
    short = [random_ids(rng, 8) for _ in range(REQUESTS)]
    a = run_batch(engine, short, 2)
    b = run_batch(engine, short, 34)  # 32 more decode steps than ``a``
    return {"prefill_1000_ms": one.wall_s * 1e3, "decode_step_batch32_ms": (b.wall_s - a.wall_s) / 32 * 1e3}


def median_of(rounds: list[dict[str, Any]], *path: str | int) -> float:
    values = []
    for r in rounds:
        v: Any = r
        for p in path:
            v = v[p]
        values.append(v)
    return statistics.median(values)


def machine() -> dict[str, Any]:
    model = platform.processor()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__}


def report(rounds: list[dict[str, Any]], costs: dict[str, float]) -> dict[str, Any]:
    n = len(rounds)
    med: dict[str, Any] = {"chat": {}, "distinct": {}, "conversation": {}}
    print(f"\n1,000-token prefill: {costs['prefill_1000_ms']:.0f} ms; batch-32 decode step: "
          f"{costs['decode_step_batch32_ms']:.1f} ms (off engine, before the rounds)")
    print(f"\nchat: shared {PREFIX}-token prefix, {REQUESTS} requests at once; median of {n} round(s)")
    cols = [("off", "off_first"), ("on, first wave", "on_first"), ("off (warm set)", "off_warm"), ("on, warm", "on_warm")]
    print(f"{'':>24}" + "".join(f"{c:>16}" for c, _ in cols))
    for label, key, scale in (("TTFT p50 ms", "ttft_p50_ms", 1), ("TTFT p90 ms", "ttft_p90_ms", 1),
                              ("wall s", "wall_s", 1), ("CPU s", "cpu_s", 1), ("prompt pos. computed", "computed_tokens", 1)):
        vals = [median_of(rounds, "chat", k, key) * scale for _, k in cols]
        med["chat"].update({f"{k}.{key}": v for (_, k), v in zip(cols, vals, strict=True)})
        print(f"{label:>24}" + "".join(f"{v:>16.1f}" if key != "computed_tokens" else f"{v:>16.0f}" for v in vals))
    print(f"{'off / on':>24}{'first wave':>16}{'warm':>16}")
    for label, key in (("TTFT p50", "ttft_p50_ms"), ("TTFT p90", "ttft_p90_ms"), ("wall", "wall_s"), ("CPU s", "cpu_s")):
        first, warm = (median_of(rounds, "chat", f"ratio_{w}", key) for w in ("first", "warm"))
        med["chat"][f"ratio_first.{key}"], med["chat"][f"ratio_warm.{key}"] = first, warm
        print(f"{label:>24}{first:>15.2f}x{warm:>15.2f}x")
    print(f"\ndistinct: {REQUESTS} different {DISTINCT_PROMPT}-token prompts, nothing shared; median of {n} round(s)")
    print(f"{'':>24}{'off':>16}{'on':>16}{'on / off':>16}")
    for label, key, fmt in (("wall s", "wall_s", ".2f"), ("CPU s", "cpu_s", ".2f"), ("tok/s", "tok_per_s", ".0f")):
        off_v, on_v = median_of(rounds, "distinct", "off", key), median_of(rounds, "distinct", "on", key)
        ratio_key = {"wall_s": "on_over_off_wall", "cpu_s": "on_over_off_cpu"}.get(key)
        ratio = median_of(rounds, "distinct", ratio_key) if ratio_key else on_v / off_v
        med["distinct"].update({f"off.{key}": off_v, f"on.{key}": on_v, f"on_over_off.{key}": ratio})
        print(f"{label:>24}{off_v:>16{fmt}}{on_v:>16{fmt}}{ratio:>15.3f}x")
    hits = max(r["distinct"]["on"]["hit_tokens"] for r in rounds)
    print(f"{'cache hits (on)':>24}{'':>16}{hits:>16}")
    print(f"\nconversation: {TURNS} turns, {PREFIX}-token system prompt, {USER_MESSAGE}-token messages; median of {n} round(s)")
    print(f"{'turn':>6}{'prompt':>10}{'computed off':>14}{'computed on':>13}{'ms off':>10}{'ms on':>10}")
    med["conversation"] = []
    for t in range(TURNS):
        row = {"turn": t + 1, "prompt_tokens": median_of(rounds, "conversation", "on", t, "prompt_tokens")}
        for side in ("off", "on"):
            row[f"computed_{side}"] = median_of(rounds, "conversation", side, t, "computed_tokens")
            row[f"ms_{side}"] = median_of(rounds, "conversation", side, t, "wall_ms")
        med["conversation"].append(row)
        print(f"{t + 1:>6}{row['prompt_tokens']:>10.0f}{row['computed_off']:>14.0f}{row['computed_on']:>13.0f}"
              f"{row['ms_off']:>10.0f}{row['ms_on']:>10.0f}")
    identical = all(r["chat"]["identical_first"] and r["chat"]["identical_warm"] and r["distinct"]["identical"]
                    and r["conversation"]["identical"] for r in rounds)
    print(f"\ngreedy tokens identical on vs off for every request: {identical}")
    med["identical"] = identical
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--chat-tokens", type=int, default=16, help="new tokens per request")
    ap.add_argument("--no-check", action="store_true", help="warn instead of failing when outputs differ on vs off")
    ap.add_argument("--no-mixed-batches", action="store_true",
                    help="both engines with mixed_batches=False (prefill and decode rows in separate steps)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    check = not args.no_check
    started = datetime.datetime.now(datetime.UTC)
    load = [os.getloadavg()]
    print(f"Llama {args.layers} layers, hidden {args.hidden}, vocab 156940, float32; torch threads "
          f"{torch.get_num_threads()}; mixed_batches {not args.no_mixed_batches}; load average {load[0][0]:.2f}",
          flush=True)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        ckpt = write_checkpoint(Path(d), args.layers, args.hidden)
        mixed = not args.no_mixed_batches
        on, off = build(ckpt, True, mixed), build(ckpt, False, mixed)
        try:
            warm_rng = random.Random(12345)
            for engine in (on, off):  # first-call costs (weight packing, buffers) outside the rounds
                run_batch(engine, [random_ids(warm_rng, 300) for _ in range(4)], 4)
            costs = decode_vs_prefill(off, warm_rng)
            for i in range(args.rounds):
                rng = random.Random(1000 + i)
                on_first = i % 2 == 0
                t0 = time.perf_counter()
                rounds.append({
                    "chat": chat_round(on, off, rng, on_first, args.chat_tokens, check),
                    "distinct": distinct_round(on, off, rng, on_first, args.chat_tokens, check),
                    "conversation": conversation_round(on, off, rng, on_first, args.chat_tokens, check),
                    "load_after": os.getloadavg(),
                })
                load.append(os.getloadavg())
                c = rounds[-1]["chat"]
                print(f"round {i + 1}/{args.rounds} ({time.perf_counter() - t0:.0f} s, load {load[-1][0]:.2f}): chat TTFT p50 "
                      f"off/on first {c['ratio_first']['ttft_p50_ms']:.2f}x, warm {c['ratio_warm']['ttft_p50_ms']:.2f}x; "
                      f"distinct on/off wall {rounds[-1]['distinct']['on_over_off_wall']:.3f}x", flush=True)
            kv = on.core.nodes["lm"].kv
            cache = kv.prefix_cache
            assert cache is not None
            cache_state = {"cached_blocks": cache.num_cached, "evictions": cache.evictions,
                           "free_blocks": kv.num_free_blocks, "total_blocks": kv.num_blocks}
            assert kv.num_free_blocks == kv.num_blocks, "blocks still held after every request finished"
            preemptions = {"on": on.core.stats.preemptions, "off": off.core.stats.preemptions}
        finally:
            on.close()
            off.close()
    medians = report(rounds, costs)
    print(f"on engine's cache at the end: {cache_state}; preemptions {preemptions}; "
          f"load average {min(x[0] for x in load):.2f}-{max(x[0] for x in load):.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "prefix_caching", "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "started_utc": started.isoformat(timespec="seconds"),
            "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "machine": machine(), "load_average_1_5_15": load, "costs_ms": costs, "medians": medians,
            "cache_end": cache_state, "preemptions": preemptions, "rounds": rounds,
        }, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
