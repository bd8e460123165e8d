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

``--saved-voice`` (issue #38's prefix-caching target) measures instead one saved voice
speaking ``--sentences`` (8) sentences one after another, on a mid-size random Base
(voice clone) checkpoint, with and without ``prefix_caching`` (two engines, same weights,
16-position blocks): the TTFA of sentence 1 against the median of sentences 2..N, and the
prompt positions each sentence computed. The voice is a clone prompt as a saved voice
stores it (in-context mode: x-vector, reference codes of ``--ref-seconds`` of audio, a
transcript of ``--ref-text-tokens`` tokens) with random values, and the sentences are
12-24 random ordinary text tokens: token counts of real English (the tiny tokenizer spells
text nearly character by character, which would inflate both). Each of ``--rounds``
rounds takes a fresh voice and sentences, runs on then off (alternating which first), and
each engine first speaks one sentence in another voice (warm-up), and last sentence 1
again ("TTFA 1 again": with the cache, its whole prompt but one position is mapped, the
most prefix caching can save at this size). The first sentence's
prompt is computed whole; later ones map the voice's whole blocks (qwen-tts's layout puts
the role, think tags, x-vector and transcript before the sentence's text, and the
reference codes after it or beside it, so only the former can be shared).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/qwen3tts_tts.py --saved-voice --threads 1 --rounds 3 \
        --json benchmarks/results/qwen3tts_saved_voice_2026-12-05.json

With ``--inline-clip`` every request sends the clip itself (``ref_audio`` of ``--ref-seconds``
of a random tone and noise, ``ref_text`` of ``--ref-text-tokens`` words) through the plugin's
adapter, as ``/v1/audio/speech`` does, so the clone encoders run in the engine: with prefix
caching, requests 2..N take the clip's x-vector and reference codes from the encoders'
output cache and the voice's prompt head from the prefix cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from mstar import Engine
from mstar.bench import BenchRequest, LocalServer, RunOptions
from mstar.bench import run as bench_run
from mstar_qwen3tts.clone_loading import codec_encoder_rates, reference_frames
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.prompt import assistant_text, build_clone_prompt, build_prompt
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


def timed_request(engine: Engine, inputs: dict, frames: int, kwargs: dict | None = None) -> float:
    """One request alone: seconds from ``add_request`` to its first audio chunk (it runs
    to its end before this returns)."""
    sampling = {"talker": {"main": {"max_tokens": frames, "min_tokens": frames}}}
    start = time.perf_counter()
    handle = engine.add_request(inputs, sampling, kwargs)
    first = 0.0
    while True:
        out = handle.queue.get()
        if out.signal == "audio" and not first:
            first = time.perf_counter() - start
        if out.finished:
            assert out.error is None, out.error
            return first


def saved_voice_prompts(ckpt: Path, rng: torch.Generator, sentences: int, ref_seconds: float,
                        ref_text_tokens: int) -> list[dict]:
    """A random saved voice (in-context clone prompt) and ``sentences`` prompts in it."""
    config = load_config(ckpt)
    cfg = Qwen3TTSConfig.from_dict(config)
    role_and_tail = encode(load_tokenizer(ckpt), assistant_text("x"))
    ordinary = sorted(set(encode(load_tokenizer(ckpt), "the quick brown fox jumps over a lazy dog, 0123456789.")))
    words = torch.tensor(ordinary)

    def text(n: int) -> list[int]:
        return words[torch.randint(len(ordinary), (n,), generator=rng)].tolist()

    rate, _ = codec_encoder_rates(config)
    ref_frames = reference_frames(config, int(ref_seconds * rate))
    speaker = torch.randn(cfg.talker.hidden_size, generator=rng)
    codes = torch.randint(cfg.codec.codebook_size, (ref_frames, cfg.talker.num_code_groups), generator=rng)
    transcript = text(ref_text_tokens)
    out = []
    for _ in range(sentences):
        ids = [*role_and_tail[:3], *text(int(torch.randint(12, 25, (1,), generator=rng))), *role_and_tail[-5:]]
        out.append(build_clone_prompt(cfg, ids, speaker, codes, transcript, "english", True).inputs())
    return out


def inline_clip_requests(ckpt: Path, rng: torch.Generator, sentences: int, ref_seconds: float,
                         ref_text_tokens: int) -> list[tuple[dict, dict]]:
    """``sentences`` speech requests (engine inputs, kwargs) that each send the same
    reference clip (a random tone and noise of ``ref_seconds``) with its transcript, made by
    the plugin's adapter as the server makes them: the encoders run in the engine."""
    import base64
    import io

    import numpy as np
    import soundfile as sf
    from mstar.api.protocol import SpeechRequest
    from mstar_qwen3tts.adapter import Qwen3TTSApiAdapter

    adapter = Qwen3TTSApiAdapter(load_config(ckpt), ckpt)
    seed = int(torch.randint(1 << 30, (1,), generator=rng))
    t = np.arange(int(ref_seconds * 24000)) / 24000
    wave = 0.3 * np.sin(2 * np.pi * (120 + seed % 200) * t) + 0.05 * np.random.default_rng(seed).standard_normal(t.shape)
    buf = io.BytesIO()
    sf.write(buf, wave.astype(np.float32), 24000, format="WAV", subtype="FLOAT")
    clip = base64.b64encode(buf.getvalue()).decode()
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "then", "it", "rests"]

    def text(n: int) -> str:
        return " ".join(words[int(i)] for i in torch.randint(len(words), (n,), generator=rng))

    transcript = text(ref_text_tokens)
    out = []
    for _ in range(sentences):
        request = SpeechRequest.model_validate({"model": "m", "input": text(int(torch.randint(12, 25, (1,), generator=rng))),
                                                "ref_audio": clip, "ref_text": transcript})
        made = adapter.speech_inputs(request)
        out.append((made.inputs, made.kwargs))
    return out


def saved_voice_main(args: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="qwen3tts-voice-") as tmp:
        ckpt = write_checkpoint(Path(tmp) / "mid-base", preset="mid", seed=0, kind="base")
        engines = {"on": Engine.from_model("qwen3tts", weights=ckpt, prefix_caching=True, block_size=16),
                   "off": Engine.from_model("qwen3tts", weights=ckpt, block_size=16)}
        for r in range(args.rounds):
            rng = torch.Generator().manual_seed(1000 + r)
            make = inline_clip_requests if args.inline_clip else saved_voice_prompts
            prompts = make(ckpt, rng, args.sentences, args.ref_seconds, args.ref_text_tokens)
            warm = make(ckpt, rng, 1, args.ref_seconds, args.ref_text_tokens)[0]  # another voice
            if not args.inline_clip:
                prompts, warm = [(p, {}) for p in prompts], (warm, {})
            for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
                engine = engines[name]
                timed_request(engine, *warm[:1], args.frames, warm[1])
                ttfa, computed, positions = [], [], []
                for p, kw in prompts:
                    hits = engine.core.stats.prefix_hit_tokens
                    ttfa.append(timed_request(engine, p, args.frames, kw))
                    # An inline clip's prompt grows by its reference codes in the engine: count what ran.
                    total = p["text_ids"].numel() if "text_ids" in p else None
                    positions.append(total)
                    computed.append(None if total is None else total - (engine.core.stats.prefix_hit_tokens - hits))
                # The bound: sentence 1 again, its whole prompt but the last position cached.
                repeat = timed_request(engine, prompts[0][0], args.frames, prompts[0][1])
                results[name].append({"ttfa_s": ttfa, "prompt_positions": positions,
                                      "computed_positions": computed, "ttfa_repeat_s": repeat})
        for engine in engines.values():
            engine.close()
    summary = {}
    voice = "one reference clip sent with every request" if args.inline_clip else "one saved voice"
    print(f"Qwen3-TTS mid-size random Base checkpoint, {voice} (in-context: {args.ref_seconds:g} s of reference "
          f"codes, {args.ref_text_tokens}-token transcript), {args.sentences} sentences of 12-24 tokens one after another, "
          f"{args.frames} frames each; torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}; "
          f"median of {args.rounds} rounds")
    print(f"{'prefix caching':<15} {'TTFA 1 ms':>10} {'TTFA 2..N ms':>13} {'ratio 1/(2..N)':>15} {'positions 1':>12} "
          f"{'computed 2..N':>14} {'TTFA 1 again':>14}")
    for name, rounds in results.items():
        first = statistics.median(r["ttfa_s"][0] for r in rounds)
        later = statistics.median(statistics.median(r["ttfa_s"][1:]) for r in rounds)
        ratio = statistics.median(r["ttfa_s"][0] / statistics.median(r["ttfa_s"][1:]) for r in rounds)
        # An inline clip's prompt is built in the engine (after its encoders): no count here.
        counted = [c for r in rounds for c in r["computed_positions"][1:] if c is not None]
        computed = statistics.median(counted) if counted else float("nan")
        firsts = [r["prompt_positions"][0] for r in rounds if r["prompt_positions"][0] is not None]
        positions = statistics.median(firsts) if firsts else float("nan")
        repeat = statistics.median(r["ttfa_repeat_s"] for r in rounds)
        summary[name] = {"ttfa_first_s": first, "ttfa_later_median_s": later, "ratio_first_over_later": ratio,
                         "prompt_positions_first": positions, "computed_positions_later_median": computed,
                         "ttfa_repeat_first_s": repeat}
        print(f"{name:<15} {first * 1e3:>10.1f} {later * 1e3:>13.1f} {ratio:>15.2f} {positions:>12.0f} {computed:>14.0f} "
              f"{repeat * 1e3:>14.1f}")
    later_ratio = summary["off"]["ttfa_later_median_s"] / summary["on"]["ttfa_later_median_s"]
    print(f"sentences 2..N, TTFA off/on: x{later_ratio:.2f}")
    if args.json:
        command = f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} {os.path.relpath(sys.executable)} {' '.join(sys.argv)}"
        record = {"command": command,
                  "args": vars(args), "torch_threads": torch.get_num_threads(), "loadavg": os.getloadavg(),
                  "summary": summary, "later_off_over_on": later_ratio, "rounds": results}
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


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
    parser.add_argument("--saved-voice", action="store_true",
                        help="one saved voice, --sentences sentences one after another, prefix caching on vs off")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="--saved-voice: rounds, each with a fresh voice")
    parser.add_argument("--inline-clip", action="store_true", help="--saved-voice: every request sends the reference "
                        "clip itself (ref_audio + ref_text through the adapter; the clone encoders run in the engine)")
    parser.add_argument("--ref-seconds", type=float, default=10.0, help="--saved-voice: the reference clip's length")
    parser.add_argument("--ref-text-tokens", type=int, default=30, help="--saved-voice: the transcript's tokens")
    parser.add_argument("--json", default=None, help="--saved-voice: write the figures here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.saved_voice:
        if args.frames == 40:  # TTFA needs only the first chunk; keep the run short
            args.frames = 16
        saved_voice_main(args)
        return
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
