"""Qwen3-TTS: time to first audio (TTFA) and real-time factor (RTF) at concurrency 1 and 8,
mstar vs the qwen-tts 0.1.1 reference generate, on the same mid-size random checkpoint.

    .venv/bin/python benchmarks/qwen3tts_tts.py [--frames 40] [--concurrency 1 8] \
        [--ref-python /tmp/qwen-tts-ref/bin/python] [--server]

``--server`` also serves the checkpoint with ``mstar serve`` and measures the same requests
over HTTP with ``mstar bench``'s client (streamed raw PCM; TTFA from the first chunk).

The reference runs in its own venv (qwen-tts pins transformers 4.57.3; make it with
``mstar-models-qwen3tts/tools/make_fixtures.sh``, which leaves it at /tmp/qwen-tts-ref).
Both sides sample with the checkpoint's defaults and generate exactly ``--frames`` frames
(80 ms each) per request. mstar streams audio, so its TTFA is the first audio chunk;
qwen-tts returns audio when the batch is done. RTF = request wall time / audio seconds
(lower is better); ratios are mstar / reference (below 1: mstar is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

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


def run_reference(ref_python: str, ckpt: Path, frames: int, concurrency: list[int]) -> dict[int, dict]:
    cmd = [ref_python, str(TOOLS / "qwen_tts_bench_reference.py"), str(ckpt), str(frames), *map(str, concurrency)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=TOOLS)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--ref-python", default="/tmp/qwen-tts-ref/bin/python")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--server", action="store_true", help="also measure mstar serve over HTTP (mstar bench's client)")
    parser.add_argument("--codec-batch", type=int, default=None, help="codec chunks per call (default: 8 on CUDA, 1 on CPU)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qwen3tts-bench-") as tmp:
        streaming = {} if args.codec_batch is None else {"mstar_streaming": {"codec_batch": args.codec_batch}}
        ckpt = write_checkpoint(Path(tmp) / "mid", preset="mid", seed=0, overrides=streaming)
        engine = Engine.from_model("qwen3tts", weights=ckpt)
        run_mstar(engine, ckpt, args.frames, 1)  # warm-up, as the reference gets
        ours = {c: run_mstar(engine, ckpt, args.frames, c) for c in args.concurrency}
        engine.close()
        served = {}
        if args.server:
            with LocalServer(["--model", "qwen3tts", "--weights", str(ckpt), "--log-level", "warning"]) as url:
                run_server(url, args.frames, 1)  # warm-up
                served = {c: run_server(url, args.frames, c) for c in args.concurrency}
        ref = {} if args.skip_reference else run_reference(args.ref_python, ckpt, args.frames, args.concurrency)
    print(f"Qwen3-TTS mid-size random checkpoint, {args.frames} frames ({args.frames * 0.08:.1f} s audio) per request")
    print(f"{'conc':>4} | {'mstar TTFA':>10} {'ref TTFA':>9} {'ratio':>6} | {'mstar RTF':>9} {'ref RTF':>8} {'ratio':>6}")
    for c in args.concurrency:
        m, r = ours[c], ref.get(c)
        if r is None:
            print(f"{c:>4} | {m['ttfa_s']:>9.3f}s {'-':>9} {'-':>6} | {m['rtf']:>9.3f} {'-':>8} {'-':>6}")
            continue
        print(
            f"{c:>4} | {m['ttfa_s']:>9.3f}s {r['ttfa_s']:>8.3f}s {m['ttfa_s'] / r['ttfa_s']:>6.3f} | "
            f"{m['rtf']:>9.3f} {r['rtf']:>8.3f} {m['rtf'] / r['rtf']:>6.3f}"
        )
    for c, m in served.items():
        print(f"{c:>4} | mstar serve over HTTP: TTFA {m['ttfa_s']:.3f}s, RTF {m['rtf']:.3f}, {m['audio_s'] / m['wall_s']:.2f} audio s/s")


if __name__ == "__main__":
    main()
