"""Qwen3-TTS: time to first audio (TTFA) and real-time factor (RTF) at concurrency 1 and 8,
mstar vs the qwen-tts 0.1.1 reference generate, on the same mid-size random checkpoint.

    .venv/bin/python benchmarks/qwen3tts_tts.py [--frames 40] [--concurrency 1 8] \
        [--ref-python /tmp/qwen-tts-ref/bin/python] [--repeats 3] [--threads 1] [--compile] [--baseline] [--server]

``--repeats`` runs interleaved rounds (each pipeline at each concurrency, then the reference)
and reports the median run of each; ``--threads`` sets torch's threads on both sides (on a
shared machine 1 avoids two OpenMP teams spinning over each other's cores); ``--compile``
also runs mstar with ``compile_regions=True`` (the talker's frame and layer stack and the
codec's streamed decode through ``torch.compile``; its warm-up also runs the largest concurrency, so the compiles happen
before the timed rounds); ``--baseline``
also runs mstar with its earlier defaults (one codec row per call, the codec after the
talker instead of beside it) on the same weights.

``--server`` also serves the checkpoint with ``mstar serve`` and measures the same requests
over HTTP with ``mstar bench``'s client (streamed raw PCM; TTFA from the first chunk), in
``--repeats`` rounds after the in-process ones (the median; its ratios are against the
reference's median round). ``--server-args`` adds ``mstar serve`` arguments, e.g. the codec
in a process of its own (no GIL shared with the talker's steps) and the compiled frame:

    .venv/bin/python benchmarks/qwen3tts_tts.py --concurrency 8 --repeats 3 --server \
        --server-args "--config benchmarks/placements/qwen3tts_codec_apart.yaml --engine-threads 1 --engine-option compile_regions=true"

The reference runs in its own venv (qwen-tts pins transformers 4.57.3; make it with
``mstar-models-qwen3tts/tools/make_fixtures.sh``, which leaves it at /tmp/qwen-tts-ref).
Both sides sample with the checkpoint's defaults and generate exactly ``--frames`` frames
(80 ms each) per request. mstar streams audio, so its TTFA is the first audio chunk;
qwen-tts returns audio when the batch is done. RTF = request wall time / audio seconds
(lower is better); throughput = audio seconds per wall second over the batch; ratios are
printed so that > 1 favours mstar.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch
from mstar import Engine
from mstar.bench import BenchRequest, LocalServer, RunOptions
from mstar.bench import run as bench_run
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.prompt import assistant_text, build_prompt
from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint

TOOLS = Path(__file__).resolve().parents[1] / "mstar-models-qwen3tts" / "tools"
TEXTS = [f"Benchmark sentence number {i}, spoken at a steady pace." for i in range(64)]


def run_mstar(engine: Engine, ckpt: Path, frames: int, concurrency: int) -> dict:
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
    tok = load_tokenizer(ckpt)
    rate = cfg.codec.sample_rate
    prompts = [build_prompt(cfg, encode(tok, assistant_text(t)), "vivian", "english").inputs() for t in TEXTS[:concurrency]]
    sampling = {"talker": {"main": {"max_tokens": frames, "min_tokens": frames}}}
    first: list[float] = [0.0] * concurrency
    done: list[float] = [0.0] * concurrency
    samples: list[int] = [0] * concurrency

    def consume(i: int, handle, start: float) -> None:
        while True:
            out = handle.queue.get()
            if out.signal == "audio":
                first[i] = first[i] or time.perf_counter() - start
                samples[i] += out.data.numel()
            if out.finished:
                assert out.error is None, out.error
                done[i] = time.perf_counter() - start
                return

    start = time.perf_counter()
    handles = [engine.add_request(p, sampling) for p in prompts]
    threads = [threading.Thread(target=consume, args=(i, h, start)) for i, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    audio = [s / rate for s in samples]
    return {
        "ttfa_s": statistics.mean(first),
        "rtf": statistics.mean(d / a for d, a in zip(done, audio, strict=True)),
        "wall_s": max(done),
        "audio_s": sum(audio),
    }


def run_server(url: str, frames: int, concurrency: int) -> dict:
    """The same requests through ``mstar serve`` and ``mstar bench``'s client (raw PCM)."""
    body = {"voice": "vivian", "language": "english", "max_tokens": frames, "min_tokens": frames}
    requests = [BenchRequest("speech", {"input": t, **body}) for t in TEXTS[:concurrency]]
    result = bench_run(requests, RunOptions(url, model="qwen3tts", speech_format="audio"))
    failed = [r.error for r in result.records if not r.ok]
    if failed:
        raise SystemExit(f"{len(failed)} server request(s) failed: {failed[0]}")
    return {
        "ttfa_s": statistics.mean(r.first_output for r in result.records),
        "rtf": statistics.mean(r.latency / r.audio_seconds for r in result.records),
        "wall_s": result.duration,
        "audio_s": sum(r.audio_seconds for r in result.records),
    }


def run_reference(ref_python: str, ckpt: Path, frames: int, concurrency: list[int], threads: int | None) -> dict[int, dict]:
    cmd = [ref_python, str(TOOLS / "qwen_tts_bench_reference.py"), str(ckpt), str(frames), *map(str, concurrency)]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=TOOLS, env=env)
    if proc.returncode:
        raise SystemExit(f"reference failed:\n{proc.stderr[-3000:]}")
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["concurrency"]] = {
                "ttfa_s": r["wall_s"],  # audio arrives with the whole batch
                "rtf": statistics.mean(r["wall_s"] / a for a in r["audio_s"]),
                "wall_s": r["wall_s"],
                "audio_s": sum(r["audio_s"]),
            }
    return out


def _median(runs: list[dict]) -> dict:
    """The run with the median wall time (the machine may be shared: rounds are repeated)."""
    return sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--ref-python", default="/tmp/qwen-tts-ref/bin/python")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--server", action="store_true", help="also measure mstar serve over HTTP (mstar bench's client)")
    parser.add_argument("--server-args", default="", help="extra `mstar serve` arguments for --server, e.g. "
                        "'--config placement.yaml --engine-threads 1' (the codec in a process of its own)")
    parser.add_argument("--codec-batch", type=int, default=None, help="codec chunks per call (default: the plugin's, by device)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds; the median run is reported")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of both sides (default: torch's)")
    parser.add_argument("--compile", action="store_true",
                        help="also mstar with compile_regions=True (talker frame, layer stack and codec through torch.compile)")
    parser.add_argument("--baseline", action="store_true",
                        help="also mstar with the earlier defaults (one codec row per call, codec after the talker)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="qwen3tts-bench-") as tmp:
        streaming = {} if args.codec_batch is None else {"mstar_streaming": {"codec_batch": args.codec_batch}}
        ckpt = write_checkpoint(Path(tmp) / "mid", preset="mid", seed=0, overrides=streaming)
        engines = {"mstar": Engine.from_model("qwen3tts", weights=ckpt)}
        if args.baseline:  # same weights (same seed), one codec row per call, no overlap
            old = write_checkpoint(Path(tmp) / "mid-old", preset="mid", seed=0, overrides={"mstar_streaming": {"codec_batch": 1}})
            engines["mstar-old"] = Engine.from_model("qwen3tts", weights=old, overlap_nodes=False)
        if args.compile:
            engines["mstar-comp"] = Engine.from_model("qwen3tts", weights=ckpt, compile_regions=True)
        for name, engine in engines.items():
            run_mstar(engine, ckpt, args.frames, 1)  # warm-up, as the reference gets
            if name == "mstar-comp":  # compiles its one-row and several-row shapes now
                run_mstar(engine, ckpt, args.frames, max(args.concurrency))
        # Interleaved rounds, so load from anything else on the machine hits every pipeline alike.
        for _ in range(args.repeats):
            for c in args.concurrency:
                for name, engine in engines.items():
                    runs.setdefault((name, c), []).append(run_mstar(engine, ckpt, args.frames, c))
            if not args.skip_reference:
                for c, r in run_reference(args.ref_python, ckpt, args.frames, args.concurrency, args.threads).items():
                    runs.setdefault(("reference", c), []).append(r)
        for engine in engines.values():
            engine.close()
        served = {}
        if args.server:
            with LocalServer(["--model", "qwen3tts", "--weights", str(ckpt), "--log-level", "warning", *args.server_args.split()]) as url:
                for c in sorted({1, max(args.concurrency)}):  # warm-up (and compiles, with compile_regions)
                    run_server(url, args.frames, c)
                served = {c: _median([run_server(url, args.frames, c) for _ in range(args.repeats)]) for c in args.concurrency}
    results = {k: _median(v) for k, v in runs.items()}
    print(f"Qwen3-TTS mid-size random checkpoint, {args.frames} frames ({args.frames * 0.08:.1f} s audio) per request, "
          f"torch threads {torch.get_num_threads()}, median of {args.repeats}")
    print(f"{'pipeline':<11} {'conc':>4} {'TTFA s':>8} {'RTF':>7} {'audio s/s':>10} {'wall s':>7}")
    for (name, c), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{name:<11} {c:>4} {r['ttfa_s']:>8.3f} {r['rtf']:>7.3f} {r['audio_s'] / r['wall_s']:>10.3f} {r['wall_s']:>7.2f}")
    if not args.skip_reference:
        print("\nratios vs the reference (> 1: mstar is better): TTFA ref/mstar, RTF ref/mstar, throughput mstar/ref")
        for c in args.concurrency:
            ref = results[("reference", c)]
            for name in engines:
                m = results[(name, c)]
                print(f"  {name:<10} concurrency {c}: TTFA x{ref['ttfa_s'] / m['ttfa_s']:.2f}, RTF x{ref['rtf'] / m['rtf']:.2f}, "
                      f"throughput x{(m['audio_s'] / m['wall_s']) / (ref['audio_s'] / ref['wall_s']):.2f}")
    for c, m in served.items():
        line = f"{c:>4} | mstar serve over HTTP: TTFA {m['ttfa_s']:.3f}s, RTF {m['rtf']:.3f}, {m['audio_s'] / m['wall_s']:.2f} audio s/s"
        ref = results.get(("reference", c))
        if ref is not None:  # the reference's median round of the in-process part above
            line += (f"; vs the reference: TTFA x{ref['ttfa_s'] / m['ttfa_s']:.2f}, RTF x{ref['rtf'] / m['rtf']:.2f}, "
                     f"throughput x{(m['audio_s'] / m['wall_s']) / (ref['audio_s'] / ref['wall_s']):.2f}")
        print(line)


if __name__ == "__main__":
    main()
