"""Engine overhead: toy model tokens/s through ``mstar.Engine`` vs a bare loop over the
same modules with a preallocated contiguous KV cache, at batch 1, 8 and 32, in one run.

    .venv/bin/python benchmarks/engine_overhead.py [--layers 8 --hidden 512 --tokens 64 --rounds 1]

Both sides do the same work: prefill all rows together, then greedy decode of the token and
the residual code with the same modules, dtype and threads, and the toy's codec decoding each
row's codes chunk by chunk (the stream's chunk policy, one chunk per call, as the engine runs
it). What differs: the engine's attention reads a paged cache (through its decode buffer) with
keys padded to whole blocks and a mask, where the bare loop slices its contiguous cache; the
engine samples through its sampler, the bare loop takes argmaxes. Both use oneDNN-packed
linears (``mstar.layers.packed_linear``, the engine's default on CPU) unless ``--unpacked``.

Prints a table; the ratio is engine / bare (1.0 = no overhead), of wall-clock tokens/s and
of tokens per CPU second (the process's, all threads: steadier on a shared machine). "host
ms/step": the engine's wall time minus the time inside its nodes' ``forward_batched`` (the
LM's, sampler included, and the codec's), per engine step (``engine.core.stats.steps``, one
forward each): what the engine spends outside the model; the median over rounds.

``--count-ops`` prints instead, per batch, aten ops (as a TorchDispatchMode sees them) per
decode step: the LM's layers (``hidden_states``, attention included), one attention call, and
everything each side runs (the engine's steps, the bare loop's body; prefill and codec
included) divided by the tokens. Counts do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from mstar import Engine
from mstar.attention.torch_backend import TorchAttentionBackend
from mstar.layers.packed_linear import pack_linears
from mstar.model.submodule_base import ModelInputsFromEngine
from mstar.weights import load_weights
from mstar_toy.checkpoint import write_checkpoint
from mstar_toy.config import load_config
from mstar_toy.decoder import ToyDecoder
from mstar_toy.lm import ToyLM
from mstar_toy.plugin import chunk_policy
from torch.utils._python_dispatch import TorchDispatchMode


class ContiguousCache:
    """The bare loop's attention: a [B, max_len, Hkv, D] cache per layer, SDPA over a prefix."""

    def __init__(self, layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int) -> None:
        self.k = torch.zeros(layers, batch, max_len, kv_heads, head_dim)
        self.v = torch.zeros_like(self.k)
        self.start = 0
        self.length = 0

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale=None) -> torch.Tensor:
        b = self.k.shape[1]
        t = q.shape[0] // b
        end = self.start + t
        self.k[layer, :, self.start : end] = k.view(b, t, *k.shape[1:])
        self.v[layer, :, self.start : end] = v.view(b, t, *v.shape[1:])
        qq = q.view(b, t, *q.shape[1:]).transpose(1, 2)
        kk = self.k[layer, :, :end].transpose(1, 2)
        vv = self.v[layer, :, :end].transpose(1, 2)
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=t > 1, enable_gqa=True)
        return out.transpose(1, 2).reshape(b * t, *q.shape[1:])


def timed(fn, *args) -> tuple[float, float]:
    """``fn(*args)`` returns wall-clock tokens/s; also tokens per CPU second of this process."""
    cpu = time.process_time()
    rate = fn(*args)
    batch, tokens = args[-2], args[-1]
    return rate, batch * tokens / (time.process_time() - cpu)


def decode_chunks(decoder: ToyDecoder, policy, codes: torch.Tensor, consumed: list[int], length: int, closed: bool) -> None:
    """Decode every row's chunks that are ready, one chunk per call (the decoder does not batch)."""
    for b in range(codes.shape[0]):
        while (cut := policy.next_chunk(length, consumed[b], closed)) is not None:
            start, end, context = cut
            decoder.decode(codes[b : b + 1, start:end])[0, context:].reshape(-1)
            consumed[b] = end


def bare_loop(lm: ToyLM, decoder: ToyDecoder, prompt_len: int, batch: int, tokens: int) -> float:
    cfg = lm.cfg
    cache = ContiguousCache(cfg["num_hidden_layers"], batch, prompt_len + tokens + 1, cfg["num_key_value_heads"], lm.head_dim)
    policy = chunk_policy(cfg["stream"])
    codes = torch.zeros(batch, tokens, 2, dtype=torch.long)
    consumed = [0] * batch
    ids = torch.randint(0, 256, (batch, prompt_len))
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(tokens):
            t = ids.shape[1]
            pos = torch.arange(cache.start, cache.start + t).repeat(batch)
            ei = ModelInputsFromEngine([], {}, attention=cache, positions=pos)
            h = lm.hidden_states(ids.reshape(-1), ei).view(batch, t, -1)[:, -1]
            h = lm.norm(h)
            tok = lm.head(h).argmax(-1)
            residual = lm.aux_head(h + lm.aux_embed(tok)).argmax(-1)
            codes[:, i, 0], codes[:, i, 1] = tok, residual
            decode_chunks(decoder, policy, codes, consumed, i + 1, closed=False)
            cache.start += t
            ids = tok[:, None]
        decode_chunks(decoder, policy, codes, consumed, tokens, closed=True)
    return batch * tokens / (time.perf_counter() - start)


class ForwardTimer:
    """Seconds inside the engine's nodes' ``forward_batched`` (instance attributes shadow the
    methods the executors call), for the engine's host time per step."""

    def __init__(self, engine: Engine) -> None:
        self.seconds = 0.0
        for node in engine.core.nodes.values():  # the toy's LM and codec
            sub = node.submodule
            sub.forward_batched = self._wrap(sub.forward_batched)  # type: ignore[method-assign]

    def _wrap(self, forward: Callable[..., object]) -> Callable[..., object]:
        def timed(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def engine_run(engine: Engine, prompt_len: int, batch: int, tokens: int) -> float:
    sampling = {"main": {"temperature": 0, "max_tokens": tokens, "ignore_eos": True}, "aux": {"residual": {"temperature": 0}}}
    reqs = [{"inputs": {"prompt_ids": torch.randint(0, 256, (prompt_len,))}, "sampling": sampling} for _ in range(batch)]
    start = time.perf_counter()
    res = engine.run_batch(reqs)
    elapsed = time.perf_counter() - start
    samples = engine.built.config["decoder"]["samples_per_token"]
    assert all(r.error is None and len(r.cat("token")) == tokens and len(r.cat("audio")) == tokens * samples for r in res), [r.error for r in res][:1]
    return batch * tokens / elapsed


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while active (in the thread that entered it)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counting(owner: object, name: str, calls: list[int], when: Callable[..., bool] = lambda *a: True) -> Iterator[None]:
    """While active, ``owner.name(...)`` appends its op count to ``calls`` when ``when(*args)``."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003
        if not when(*args):
            return original(*args, **kwargs)
        with OpCounter() as counter:
            out = original(*args, **kwargs)
        calls.append(counter.ops)
        return out

    setattr(owner, name, wrapped)
    try:
        yield
    finally:
        setattr(owner, name, original)


def count_ops(engine: Engine, lm: ToyLM, decoder: ToyDecoder, prompt_len: int, batch: int, tokens: int) -> dict[str, tuple[float, float]]:
    """(engine, bare) aten ops per decode step: the LM's layers, one attention call, all."""
    # Decode calls only: one token per row (hidden_states(ids, ...), run(layer, q, ...)).
    decode_lm = lambda _self, ids, *rest: ids.shape[0] == batch  # noqa: E731
    decode_attn = lambda _self, _layer, q, *rest: q.shape[0] == batch  # noqa: E731
    sides = {"engine": (TorchAttentionBackend, lambda: engine_run(engine, prompt_len, batch, tokens)),
             "bare": (ContiguousCache, lambda: bare_loop(lm, decoder, prompt_len, batch, tokens))}
    out: dict[str, list[float]] = {"layers": [], "attention": [], "all": []}
    for side, (attention, run) in sides.items():
        layers: list[int] = []
        attn: list[int] = []
        everything: list[int] = []
        step: tuple[object, str] = (type(engine.core), "step") if side == "engine" else (__import__(__name__), "bare_loop")
        with counting(ToyLM, "hidden_states", layers, decode_lm), counting(attention, "run", attn, decode_attn), counting(*step, everything):
            run()
        out["layers"].append(statistics.median(layers))
        out["attention"].append(statistics.median(attn))
        out["all"].append(sum(everything) / tokens)
    return {k: (v[0], v[1]) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds per batch; medians are printed")
    ap.add_argument("--count-ops", action="store_true", help="print aten ops per decode step instead of timing")
    ap.add_argument("--unpacked", action="store_true", help="plain F.linear on both sides (cpu_packed_linears=False)")
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        ckpt = write_checkpoint(
            Path(d), hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
        )
        lm = ToyLM(load_config(ckpt))
        load_weights(lm, ckpt, prefix="lm.")
        lm.eval()
        decoder = ToyDecoder(load_config(ckpt))
        load_weights(decoder, ckpt, prefix="decoder.")
        decoder.eval()
        if not args.unpacked:  # what the engine does to its nodes' modules on CPU
            pack_linears(lm)
            pack_linears(decoder)
        engine = Engine.from_model("toy", weights=ckpt, kv_budget_bytes=1 << 30, max_num_seqs=64, cpu_packed_linears=not args.unpacked)
        engine_run(engine, args.prompt, 2, 4)  # warm-up
        bare_loop(lm, decoder, args.prompt, 2, 4)
        print(f"toy LM: {args.layers} layers, hidden {args.hidden}, prompt {args.prompt}, {args.tokens} new tokens, torch threads {torch.get_num_threads()}")
        if args.count_ops:
            print("aten ops per decode step, engine / bare: LM layers | one attention call | all (steps incl. prefill and codec, / tokens)")
            for b in (int(x) for x in args.batches.split(",")):
                c = count_ops(engine, lm, decoder, args.prompt, b, args.tokens)
                print(f"batch {b:>2}: " + " | ".join(f"{k} {e:.0f} / {r:.0f}" for k, (e, r) in c.items()))
            engine.close()
            return
        forwards = ForwardTimer(engine)  # after the op counts: only the timed runs need it
        print(f"{'batch':>5} | {'bare tok/s':>10} | {'engine tok/s':>12} | {'engine/bare':>11} | {'per CPU s':>9} | {'host ms/step':>12} | load (1 min)")
        for b in (int(x) for x in args.batches.split(",")):
            runs = []
            host_ms = []
            for i in range(args.rounds):  # which side goes first alternates, so neither always follows the other
                sides = [(bare_loop, lm, decoder), (engine_run, engine)]
                order = sides if i % 2 == 0 else sides[::-1]
                done = []
                for side in order:
                    steps, inside = engine.core.stats.steps, forwards.seconds
                    done.append(timed(*side, args.prompt, b, args.tokens))
                    if side[0] is engine_run:  # its wall time is batch x tokens / its tokens/s
                        wall = b * args.tokens / done[-1][0]
                        host_ms.append(1e3 * (wall - (forwards.seconds - inside)) / (engine.core.stats.steps - steps))
                runs.append(done if i % 2 == 0 else done[::-1])
            bare, bare_cpu, eng, eng_cpu = (statistics.median(r[i][j] for r in runs) for i in (0, 1) for j in (0, 1))
            load = os.getloadavg()[0]  # the machine's, as the rounds ended: shared cores skew wall time
            print(f"{b:>5} | {bare:>10.1f} | {eng:>12.1f} | {eng / bare:>11.2f} | {eng_cpu / bare_cpu:>9.2f} | "
                  f"{statistics.median(host_ms):>12.3f} | {load:.1f}")
        engine.close()


if __name__ == "__main__":
    main()
