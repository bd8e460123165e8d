"""Streaming codec decode at constant cost per chunk: the Qwen3-TTS 12 Hz decoder at the
released sizes (random weights; exact left context 580 frames), one utterance of
``--seconds`` seconds.

    .venv/bin/python benchmarks/codec_streaming.py [--seconds 60] [--device cpu|cuda] \
        [--decoder-dim 1536] [--legacy] [--threads N]

Prints, in one run:
- per-chunk decode time of the stateful stream at 5 s, 30 s and 60 s into the utterance
  (median of the last 3 full chunks ending by the mark; flat = constant cost), in wall
  and in this process's CPU seconds (steadier on a shared CPU),
- total streaming time / one whole decode of the same codes (target <= 1.3),
- the 60 s correctness check: max |streamed - whole| over the utterance,
- with ``--legacy``: the same chunk decoded the old way (stateless, re-decoding the exact
  580-frame left context), for comparison.

A CPU run at the released width takes minutes (the whole decode alone is ~3 TFLOP for
60 s); ``--decoder-dim`` narrows the convolution stack for a quick look (not the target).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from mstar.layers.streaming import StreamState
from mstar_qwen3tts.codec_released import random_codec, released_codec_config

FRAME_RATE = 12.5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device):  # noqa: ANN001, ANN202
    """(result, wall seconds, this process's CPU seconds). On a shared CPU the CPU seconds
    (with one thread) are the steadier measure: other processes' load stretches wall time."""
    _sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--chunk", type=int, default=12)
    parser.add_argument("--first-chunk", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--decoder-dim", type=int, default=None, help="narrower conv stack (default: released 1536)")
    parser.add_argument("--legacy", action="store_true", help="also time the stateless left-context chunk")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    overrides = {} if args.decoder_dim is None else {"decoder_dim": args.decoder_dim}
    cfg = released_codec_config(**overrides)
    node = random_codec(cfg).to(device)
    frames = int(round(args.seconds * FRAME_RATE))
    codes = torch.randint(0, cfg.codebook_size, (frames, cfg.num_quantizers), generator=torch.Generator().manual_seed(0))
    codes = codes.to(device)
    sizes, start = [], 0
    while start < frames:
        size = min(args.first_chunk if start == 0 else args.chunk, frames - start)
        sizes.append((start, size))
        start += size

    with torch.inference_mode():
        # Warm-up at every chunk shape the stream uses (kernels, allocator).
        warm = StreamState()
        for size in {s for _, s in sizes[:3]} | {sizes[-1][1]}:
            node.decode_chunk(codes[:size], warm)
        node.decode(codes[: args.chunk * 2])
        whole, t_whole, c_whole = _timed(lambda: node.decode(codes), device)
        state, parts, per_chunk = StreamState(), [], []
        for s, size in sizes:
            out, dt, dc = _timed(lambda s=s, size=size: node.decode_chunk(codes[s : s + size], state), device)
            parts.append(out)
            per_chunk.append((s, size, dt, dc))
        streamed = torch.cat(parts)
        err = float((streamed - whole).abs().max())
        legacy: dict[str, float] = {}
        if args.legacy:
            rf = cfg.receptive_field_frames()
            for sec in (5, 30, 60):
                s = min(int(sec * FRAME_RATE), frames) - args.chunk  # the chunk ending at the mark
                if s < 0:
                    continue
                lo = max(0, s - rf)
                _, dt, _ = _timed(lambda lo=lo, s=s: node.decode(codes[lo : s + args.chunk], context=s - lo), device)
                legacy[f"{sec}s"] = dt

    t_stream = sum(dt for *_, dt, _ in per_chunk)
    c_stream = sum(dc for *_, dc in per_chunk)
    at: dict[str, float] = {}
    at_cpu: dict[str, float] = {}
    for sec in (5, 30, 60):
        # The last three full chunks that end by the mark.
        window = [(dt, dc) for s, size, dt, dc in per_chunk if size == args.chunk and s + size <= sec * FRAME_RATE][-3:]
        if len(window) == 3 and sec * FRAME_RATE <= frames:
            at[f"{sec}s"] = statistics.median(w for w, _ in window)
            at_cpu[f"{sec}s"] = statistics.median(c for _, c in window)
    result = {
        "device": str(device), "threads": torch.get_num_threads(), "seconds": args.seconds, "frames": frames,
        "decoder_dim": cfg.decoder_dim, "receptive_field_frames": cfg.receptive_field_frames(),
        "chunk": args.chunk, "first_chunk": args.first_chunk, "chunks": len(per_chunk),
        "whole_decode_s": t_whole, "streaming_total_s": t_stream, "streaming_over_whole": t_stream / t_whole,
        "whole_decode_cpu_s": c_whole, "streaming_total_cpu_s": c_stream, "chunk_s_at": at, "chunk_cpu_s_at": at_cpu, "legacy_chunk_s_at": legacy, "max_abs_err_streamed_vs_whole": err,
        "state_bytes": state.nbytes,
    }
    print(f"codec {cfg.decoder_dim}-wide decoder, {frames} frames ({args.seconds:g} s), chunk {args.chunk} "
          f"(first {args.first_chunk}), {device}, {torch.get_num_threads()} threads")
    print(f"  whole decode            {t_whole:8.3f} s wall, {c_whole:8.3f} s CPU")
    print(f"  streaming, all chunks   {t_stream:8.3f} s wall, {c_stream:8.3f} s CPU   "
          f"ratio {t_stream / t_whole:.3f} wall, {c_stream / c_whole:.3f} CPU (target <= 1.3)")
    for k, v in at.items():
        old = f"   stateless with 580-frame context: {legacy[k]:.4f} s wall ({legacy[k] / v:.1f}x)" if k in legacy else ""
        print(f"  chunk ending at {k:>4}    {v:8.4f} s wall, {at_cpu[k]:8.4f} s CPU{old}")
    print(f"  [60 s check] max |streamed - whole| = {err:.3g} (waveform max {float(whole.abs().max()):.3f})")
    print(f"  carried state per stream: {state.nbytes / 2**20:.2f} MiB")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
