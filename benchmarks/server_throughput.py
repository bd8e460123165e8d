"""Server throughput vs the in-process engine, on the same model and requests.

Runs ``mstar.Engine`` in this process and a real ``mstar serve`` subprocess on loopback
(toy model, tiny random checkpoint by default), each at concurrency 1, 8 and 32, and prints
tokens/s and the ratio server / in-process. Requests are greedy with ``ignore_eos`` so
every run generates exactly the same tokens.

    python benchmarks/server_throughput.py [--max-tokens 64] [--requests 64] [--stream/--no-stream]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from mstar.bench import BenchRequest, RunOptions, summarize
from mstar.bench import run as bench_run


def prompts(n: int) -> list[str]:
    return [f"benchmark request {i}: say something" for i in range(n)]


async def engine_run(engine, texts: list[str], concurrency: int, max_tokens: int, encode) -> int:
    sem = asyncio.Semaphore(concurrency)
    sampling = {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, "seed": 0}

    async def one(text: str) -> int:
        async with sem:
            n = 0
            async for out in engine.generate_async({"prompt_ids": torch.tensor(encode(text))}, sampling):
                if out.signal == "token" and not out.finished:
                    n += out.data.numel()
            return n

    return sum(await asyncio.gather(*(one(t) for t in texts)))


def server_run(url: str, texts: list[str], concurrency: int, max_tokens: int, stream: bool) -> tuple[int, float, dict]:
    """The same requests through ``mstar bench``'s client: (tokens, seconds, its summary)."""
    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "seed": 0}
    requests = [BenchRequest("chat", {"messages": [{"role": "user", "content": t}], **body}) for t in texts]
    result = bench_run(requests, RunOptions(url, model="toy", max_concurrency=concurrency, stream=stream))
    summary = summarize(result)
    if summary["failed"]:
        raise SystemExit(f"{summary['failed']} request(s) failed: {next(r.error for r in result.records if not r.ok)}")
    return summary["total_output_tokens"], result.duration, summary


def timed(coro_factory) -> tuple[int, float]:
    t0 = time.perf_counter()
    tokens = asyncio.run(coro_factory())
    return tokens, time.perf_counter() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(ckpt: Path, port: int, extra: list[str]) -> subprocess.Popen:
    # stdin closed, output kept: the server logs warnings only.
    cmd = [sys.executable, "-m", "mstar.cli", "serve", "--model", "toy", "--weights", str(ckpt), "--port", str(port), "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not become healthy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=64, help="requests per level (at least 2x the concurrency)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, in-process and per engine process")
    ap.add_argument("--server-arg", action="append", default=[], help="extra argument for mstar serve")
    args = ap.parse_args()

    from mstar import Engine
    from mstar_toy.checkpoint import write_checkpoint
    from mstar_toy.config import encode_text

    ckpt = write_checkpoint(Path(tempfile.mkdtemp(prefix="mstar-bench-")))
    bos = json.loads((ckpt / "config.json").read_text())["bos_token_id"]
    levels = {c: prompts(max(args.requests, 2 * c) if c > 1 else max(8, args.requests // 4)) for c in args.concurrency}

    torch.set_num_threads(args.threads)
    engine = Engine.from_model("toy", weights=ckpt)
    enc = lambda t: encode_text(t, bos)  # noqa: E731
    port = free_port()
    proc = start_server(ckpt, port, ["--engine-threads", str(args.threads), *args.server_arg])
    url = f"http://127.0.0.1:{port}"
    local: dict[int, list[tuple[int, float]]] = {c: [] for c in args.concurrency}
    remote: dict[int, list[tuple[int, float, dict]]] = {c: [] for c in args.concurrency}
    try:
        timed(lambda: engine_run(engine, prompts(8), 8, 8, enc))  # warm-up
        server_run(url, prompts(8), 8, 8, args.stream)
        # Interleaved rounds, best of each: other load on the machine hits both sides alike.
        for _ in range(args.rounds):
            for c in args.concurrency:
                local[c].append(timed(lambda c=c: engine_run(engine, levels[c], c, args.max_tokens, enc)))
                remote[c].append(server_run(url, levels[c], c, args.max_tokens, args.stream))
    finally:
        engine.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    mode = "streamed" if args.stream else "whole"
    print(f"\ntoy model, {args.max_tokens} tokens/request, {mode} chat completions, {os.cpu_count()} CPUs, "
          f"{args.threads} torch thread(s), best of {args.rounds} interleaved rounds")
    print(f"{'concurrency':>11} {'requests':>8} {'engine tok/s':>13} {'server tok/s':>13} {'ratio':>6} {'p50 TTFT ms':>11} {'p99 ITL ms':>10}")
    for c in args.concurrency:
        lt, rt = local[c][0][0], remote[c][0][0]
        assert all(n == lt for n, _ in local[c]) and all(n == lt for n, _, _ in remote[c]), f"token counts differ at concurrency {c}"
        best_local = lt / min(t for _, t in local[c])
        _, best_time, best = min(remote[c], key=lambda r: r[1])
        best_remote = rt / best_time
        ttft, itl = best.get("p50_ttft_ms", float("nan")), best.get("p99_itl_ms", float("nan"))
        print(f"{c:>11} {len(levels[c]):>8} {best_local:>13.0f} {best_remote:>13.0f} {best_remote / best_local:>6.2f} {ttft:>11.1f} {itl:>10.1f}")

if __name__ == "__main__":
    main()
