"""Qwen3-Omni in five modes over HTTP: i2t, s2t (text out) and i2s, s2s, t2s (speech
out) at concurrency 1, 8 and 32; a real ``mstar serve`` vs transformers'
``Qwen3OmniMoeForConditionalGeneration.generate`` on the same random checkpoint, as ratios in
one run.

    .venv/bin/python benchmarks/qwen3omni_modes.py [--size small|mid] [--device cpu|cuda]
        [--modes i2t s2t i2s s2s t2s] [--concurrency 1 8 32] [--tokens 8] [--frames 12] [--rounds 1]

The checkpoint is random, written in the released layout (config.json, model.safetensors with
``thinker.*``, ``talker.*``, ``code2wav.*``, tokenizer, chat template, preprocessor config) by
``mstar_qwen3omni.tiny_checkpoint`` with sizes from ``SIZES``; Code2Wav upsamples as released
(1920 samples per frame, 80 ms of 24 kHz audio), so audio seconds and real-time factors are
those of real frames. ``small`` runs on a CPU; ``mid`` is meant for a GPU.

Requests: i2t / i2s a 224x224 PNG plus a question, s2t / s2s 4 s of 16 kHz WAV plus a question
(chat with ``image_url`` / ``input_audio`` parts), t2s ``/v1/audio/speech`` with a sentence.
Every request is greedy on every level and fixed in length: the Thinker writes exactly
``--tokens`` tokens (``ignore_eos``; transformers ``min_new_tokens``), the Talker makes exactly
``--frames`` frames, the last one dropped as both sides drop a frame at ``max_tokens``
(``min_tokens`` = ``max_tokens``; transformers ``talker_min_new_tokens``).

mstar: ``mstar serve --model qwen3omni --weights CKPT`` (``mstar.bench.LocalServer``), each
round's c requests sent at once over HTTP: text chats and t2s through ``mstar.bench.client.send``
(streamed SSE / raw PCM), spoken chats streamed here (``stream_spoken_chat``: transcript and PCM16
``delta.audio`` chunks timed apart). TTFT: first text delta; time to first audio (TTFA): first
PCM chunk; RTF: per request, latency / audio seconds.
transformers: the c requests of a round as one left-padded batch in one ``generate`` call (its
static batching; 5.24's ``generate(return_audio=True)`` batches the Talker and Code2Wav too, for
every mode); text modes with ``return_audio=False``. TTFT is the time to the batch's first token
(a ``BaseStreamer`` on the Thinker); transformers returns the waveform only at the end, so its
TTFA is the whole call.
Rounds alternate between the two sides; medians over rounds.

After the HTTP runs, an in-process ``mstar.Engine`` on the same checkpoint takes the same
requests (the adapter's engine inputs). ``--check`` (default on): one request per mode there and
through ``generate`` must give equal text ids and equal-length audio (the largest audio
difference is printed), so both sides did the same work. Stages: ``--stage-concurrency``
requests per mode at once, the node executors timed, printing each node's (and each of the
rows' walks') share of the engine's busy time; the largest share is the stage that bounds the
mode on one device (the server has no per-node timing metric).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import io
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import msgspec
import torch

TEXT_ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [12, 10, 10], "interleaved": True, "mrope_interleaved": True}
REAL_UPSAMPLING = dict(upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2])  # 1920 samples a frame
SIZES: dict[str, dict[str, Any]] = {
    "small": dict(
        text=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=64, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, mlp_only_layers=[],
                  rope_parameters=TEXT_ROPE),
        audio=dict(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256, num_mel_bins=128,
                   downsample_hidden_size=32, max_source_positions=1500),
        vision=dict(depth=2, hidden_size=128, intermediate_size=256, num_heads=4, patch_size=16,
                    num_position_embeddings=256, deepstack_visual_indexes=[0, 1]),
        talker_text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2),
        predictor=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, num_code_groups=8),
        code2wav=dict(num_quantizers=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, decoder_dim=64, **REAL_UPSAMPLING),
    ),
    "mid": dict(
        text=dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                  head_dim=64, moe_intermediate_size=256, num_experts=32, num_experts_per_tok=4, mlp_only_layers=[],
                  rope_parameters=TEXT_ROPE),
        audio=dict(d_model=512, encoder_layers=4, encoder_attention_heads=8, encoder_ffn_dim=1024, num_mel_bins=128,
                   downsample_hidden_size=128, max_source_positions=1500),
        vision=dict(depth=4, hidden_size=512, intermediate_size=1024, num_heads=8, patch_size=16,
                    num_position_embeddings=1024, deepstack_visual_indexes=[1, 3]),
        talker_text=dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=64, moe_intermediate_size=256, shared_expert_intermediate_size=512, num_experts=32, num_experts_per_tok=4),
        predictor=dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=64, num_code_groups=16),
        code2wav=dict(num_quantizers=16, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, decoder_dim=256, **REAL_UPSAMPLING),
    ),
}
MODES = {"i2t": ("image", False), "s2t": ("audio", False), "i2s": ("image", True), "s2s": ("audio", True), "t2s": (None, True)}
SAMPLE_RATE = 24000
VOICE = "Ethan"
QUESTIONS = ("What is in this?", "Describe it in detail.", "What do you notice here?", "Summarize this for me.")
SENTENCES = ("The quick brown fox jumps over the lazy dog.", "Good morning, and welcome to the show.",
             "Please read this sentence aloud.", "Rain is expected later this afternoon.")


def write_bench_checkpoint(size: str, dtype: torch.dtype) -> Path:
    """The plugin's checkpoint writer with this size's Thinker, Talker and Code2Wav (the Talker's
    and Code2Wav's tiny configs patched for the call: the writer takes no overrides for them)."""
    from mstar_qwen3omni import tiny_checkpoint as tc

    s = SIZES[size]
    talker = copy.deepcopy(tc.TINY_TALKER)
    talker["text_config"].update(s["talker_text"])
    talker["code_predictor_config"].update(s["predictor"])
    talker["num_code_groups"] = s["predictor"]["num_code_groups"]
    with mock.patch.dict(tc.TINY_TALKER, talker), mock.patch.dict(tc.TINY_CODE2WAV, s["code2wav"]):
        return tc.write_checkpoint(Path(tempfile.mkdtemp(prefix=f"qwen3omni-modes-{size}-")), s["text"], s["audio"], s["vision"],
                                   max_image_tokens=64, dtype=dtype)


# ---- requests ------------------------------------------------------------------------------------


def _png(seed: int) -> str:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _wav(seed: int, seconds: float = 4.0) -> str:
    import numpy as np
    import soundfile as sf

    samples = (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, samples, 16000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def talker_sampling(frames: int) -> dict[str, Any]:
    return {"temperature": 0, "max_tokens": frames, "min_tokens": frames, "aux": {"code_predictor": {"temperature": 0}}}


def request_bodies(mode: str, n: int, tokens: int, frames: int) -> list[tuple[str, dict[str, Any]]]:
    """(workload, JSON body) per request; distinct media and text per request."""
    media, speaks = MODES[mode]
    common = {"model": "qwen3omni", "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
    if speaks:
        common["sampling"] = {"nodes": {"talker": talker_sampling(frames)}}
    out = []
    for i in range(n):
        if media is None:
            out.append(("speech", {**common, "input": SENTENCES[i % len(SENTENCES)] + f" Number {i}.", "voice": VOICE}))
            continue
        part = ({"type": "image_url", "image_url": {"url": _png(i)}} if media == "image"
                else {"type": "input_audio", "input_audio": {"data": _wav(i), "format": "wav"}})
        body = {**common, "messages": [{"role": "user", "content": [part, {"type": "text", "text": QUESTIONS[i % len(QUESTIONS)]}]}]}
        if speaks:
            body |= {"modalities": ["text", "audio"], "audio": {"voice": VOICE, "format": "pcm16"}}
        out.append(("chat", body))
    return out


def engine_requests(adapter: Any, bodies: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """What the server's adapter turns each body into (prompt ids, processor tensors, kwargs)."""
    from mstar.api.protocol import ChatCompletionRequest, SpeechRequest

    return [adapter.speech_inputs(SpeechRequest(**b)) if w == "speech" else adapter.chat_inputs(ChatCompletionRequest(**b))
            for w, b in bodies]


# ---- mstar over HTTP -----------------------------------------------------------------------------


@dataclass
class Timing:
    """One request: seconds from sending it to its first text, first audio and last byte."""

    latency: float = 0.0
    first_text: float | None = None
    first_audio: float | None = None
    tokens: int = 0
    audio_seconds: float = 0.0
    error: str | None = None


_decode = msgspec.json.Decoder()


async def stream_spoken_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> Timing:
    """A streamed chat with audio: transcript deltas and base64 PCM16 ``delta.audio.data`` chunks."""
    t = Timing()
    start = time.perf_counter()
    pcm = 0
    done = False
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            t.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
            return t
        async for line in response.aiter_lines():
            now = time.perf_counter() - start
            if not line.startswith("data:"):
                continue
            if line[5:].strip() == "[DONE]":
                done = True
                continue
            event = _decode.decode(line[5:].strip())
            if "error" in event:
                t.error = str(event["error"])
            if event.get("usage"):
                t.tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or ():
                audio = (choice.get("delta") or {}).get("audio") or {}
                if audio.get("transcript") and t.first_text is None:
                    t.first_text = now
                if audio.get("data"):
                    t.first_audio = now if t.first_audio is None else t.first_audio
                    pcm += len(base64.b64decode(audio["data"]))
    t.latency = time.perf_counter() - start
    t.audio_seconds = pcm / 2 / SAMPLE_RATE
    if not done and t.error is None:
        t.error = "the stream ended without data: [DONE]"
    return t


async def one_mstar(client: httpx.AsyncClient, workload: str, body: dict[str, Any], tokens: int) -> Timing:
    from mstar.bench.client import send
    from mstar.bench.records import BenchRequest

    if workload == "chat" and "modalities" in body:
        return await stream_spoken_chat(client, body)
    rec = await send(client, BenchRequest(workload, body))
    t = Timing(latency=rec.latency, error=None if rec.ok else rec.error, audio_seconds=rec.audio_seconds)
    if workload == "chat":
        t.first_text, t.tokens = rec.first_output, rec.output_tokens or 0
    else:  # /v1/audio/speech reports no tokens; ignore_eos makes them exactly --tokens
        t.first_audio, t.tokens = rec.first_output, tokens
    return t


def run_mstar(url: str, bodies: list[tuple[str, dict[str, Any]]], tokens: int) -> tuple[float, list[Timing]]:
    async def all_at_once() -> tuple[float, list[Timing]]:
        limits = httpx.Limits(max_connections=len(bodies) + 4)
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800, connect=30), limits=limits) as client:
            start = time.perf_counter()
            out = await asyncio.gather(*(one_mstar(client, w, b, tokens) for w, b in bodies))
            return time.perf_counter() - start, list(out)

    wall, timings = asyncio.run(all_at_once())
    errors = [t.error for t in timings if t.error]
    if errors:
        raise RuntimeError(f"{len(errors)} mstar requests failed, e.g. {errors[0]}")
    return wall, timings


# ---- transformers --------------------------------------------------------------------------------


class FirstToken:
    """A transformers streamer that notes when the first generated ids arrive (put() gets the
    prompt first, then each step's ids)."""

    def __init__(self) -> None:
        self.calls = 0
        self.start = 0.0  # set by hf_generate when the call starts
        self.time: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.time = time.perf_counter()

    def end(self) -> None:
        pass


def hf_batch(reqs: list[Any], device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    pad = 151643
    prompts = [r.inputs["prompt_ids"] for r in reqs]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as generate expects
        ids[i, width - len(p):] = p
        mask[i, width - len(p):] = 1
    batch = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    for key in reqs[0].inputs:
        if key != "prompt_ids":
            value = torch.cat([r.inputs[key] for r in reqs])
            batch[key] = value.to(device, dtype) if value.is_floating_point() else value.to(device)
    return batch


def hf_generate(model: Any, reqs: list[Any], speaks: bool, tokens: int, frames: int, device: str, dtype: torch.dtype,
                streamer: FirstToken | None = None) -> tuple[torch.Tensor, list[torch.Tensor], float]:
    """(generated ids [c, tokens], one waveform per request (none for text), wall seconds)."""
    batch = hf_batch(reqs, device, dtype)
    kw: dict[str, Any] = dict(thinker_max_new_tokens=tokens, thinker_min_new_tokens=tokens, thinker_do_sample=False,
                              thinker_streamer=streamer, return_audio=speaks)
    if speaks:
        kw |= dict(speaker=VOICE, talker_do_sample=False, talker_max_new_tokens=frames, talker_min_new_tokens=frames)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    if streamer is not None:
        streamer.start = start
    with torch.no_grad():
        out = model.generate(**batch, **kw)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    seq = out[0] if speaks else (out.sequences if hasattr(out, "sequences") else out)
    assert seq.shape[1] == batch["input_ids"].shape[1] + tokens, seq.shape
    waves = ([] if not speaks else out[1] if isinstance(out[1], list) else [out[1].reshape(-1)])
    return seq[:, batch["input_ids"].shape[1]:], waves, wall


def run_hf(model: Any, reqs: list[Any], speaks: bool, tokens: int, frames: int, device: str, dtype: torch.dtype) -> tuple[float, list[Timing]]:
    streamer = FirstToken()
    _, waves, wall = hf_generate(model, reqs, speaks, tokens, frames, device, dtype, streamer)
    assert streamer.time is not None
    ttft = streamer.time - streamer.start
    timings = [Timing(latency=wall, first_text=ttft, first_audio=wall if speaks else None, tokens=tokens,
                      audio_seconds=waves[i].numel() / SAMPLE_RATE if speaks else 0.0) for i in range(len(reqs))]
    return wall, timings


# ---- same work on both sides, stages ---------------------------------------------------------------


def engine_sampling(tokens: int, frames: int) -> dict[str, Any]:
    return {"thinker": {"temperature": 0, "max_tokens": tokens, "ignore_eos": True},
            "talker": {"main": {"temperature": 0, "max_tokens": frames, "min_tokens": frames},
                       "aux": {"code_predictor": {"temperature": 0}}}}


def check_same_output(engine: Any, hf: Any, req: Any, speaks: bool, tokens: int, frames: int, device: str, dtype: torch.dtype) -> str:
    """One request through an in-process engine and through ``generate``: the text ids must be
    equal and the audio the same length; returns the largest audio difference, as text."""
    out = engine.run_batch([{"inputs": req.inputs, "sampling": engine_sampling(tokens, frames), "kwargs": req.kwargs}])[0]
    assert out.error is None, out.error
    ids, waves, _ = hf_generate(hf, [req], speaks, tokens, frames, device, dtype)
    if out.cat("tokens").tolist() != ids[0].tolist():
        raise AssertionError("mstar and transformers wrote different text: the two sides did not do the same work")
    if not speaks:
        return "text equal"
    ours, theirs = out.cat("audio").float().cpu(), waves[0].float().cpu()
    if ours.shape != theirs.shape:
        raise AssertionError(f"audio lengths differ: mstar {ours.numel()}, transformers {theirs.numel()} samples")
    return f"text equal, audio max |diff| {(ours - theirs).abs().max().item():.1e} over {ours.numel()} samples"


def stage_shares(engine: Any, reqs: list[Any], tokens: int, frames: int) -> dict[str, tuple[float, int]]:
    """Each node's and each node.walk's (share of the engine's busy time, forwards run) for
    ``reqs`` submitted together; nodes first, largest share first."""
    busy: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    patched = []
    for name, node in engine.core.nodes.items():
        ex = node.executor
        original = ex.run

        def timed(walk: str, rows: list[Any], _orig: Any = original, _name: str = name) -> Any:
            t0 = time.perf_counter()
            out = _orig(walk, rows)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            walks = "+".join(sorted({r.walk for r in rows}))  # the rows' own walks: a mixed forward names both
            for key in (_name, f"{_name}.{walks}"):
                busy[key] += time.perf_counter() - t0
                calls[key] += 1
            return out

        ex.run = timed
        patched.append(ex)
    sampling = engine_sampling(tokens, frames)
    try:
        outs = engine.run_batch([{"inputs": r.inputs, "sampling": sampling, "kwargs": r.kwargs} for r in reqs])
    finally:
        for ex in patched:
            del ex.run
    assert all(o.error is None for o in outs), [o.error for o in outs]
    total = sum(v for k, v in busy.items() if "." not in k)
    return {k: (v / total, calls[k]) for k, v in sorted(busy.items(), key=lambda kv: ("." in kv[0], -kv[1]))}


# ---- report --------------------------------------------------------------------------------------


@dataclass
class Cell:
    wall: float
    timings: list[Timing]

    def req_s(self) -> float:
        return len(self.timings) / self.wall

    def tok_s(self) -> float:
        return sum(t.tokens for t in self.timings) / self.wall

    def ttft(self) -> float:
        return statistics.median(t.first_text for t in self.timings if t.first_text is not None)

    def ttfa(self) -> float:
        return statistics.median(t.first_audio for t in self.timings if t.first_audio is not None)

    def audio_s(self) -> float:
        return sum(t.audio_seconds for t in self.timings) / self.wall

    def rtf(self) -> float:
        return statistics.median(t.latency / t.audio_seconds for t in self.timings)


def med(cells: list[Cell], metric: str) -> float:
    return statistics.median(getattr(c, metric)() for c in cells)


def fmt(ours: float, theirs: float, scale: float = 1.0, lower_better: bool = False, digits: int = 1) -> str:
    ratio = theirs / ours if lower_better else ours / theirs
    return f"{ours * scale:.{digits}f} / {theirs * scale:.{digits}f} ({ratio:.2f}x)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--tokens", type=int, default=8, help="Thinker tokens per request")
    ap.add_argument("--frames", type=int, default=12, help="Talker frames per spoken request (the last one dropped)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--stage-concurrency", type=int, default=8, help="0: skip the stage breakdown")
    ap.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                    help="after the timed runs, check that one request per mode gives the same text (and audio) on both sides")
    ap.add_argument("--keep-checkpoint", action="store_true", help="leave the random checkpoint in its temporary directory")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra mstar serve argument (repeatable)")
    args = ap.parse_args()

    from mstar import Engine
    from mstar.bench import LocalServer
    from mstar_qwen3omni.plugin import mstar_api_adapter, mstar_model_spec
    from transformers import Qwen3OmniMoeForConditionalGeneration

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    ckpt = write_bench_checkpoint(args.size, dtype)
    adapter = mstar_api_adapter("qwen3omni", mstar_model_spec().load_config(ckpt), ckpt)
    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt, dtype=dtype).to(args.device).eval()
    width = max(args.concurrency)
    bodies = {m: request_bodies(m, width, args.tokens, args.frames) for m in args.modes}
    reqs = {m: engine_requests(adapter, b) for m, b in bodies.items()}

    serve = ["--model", "qwen3omni", "--weights", str(ckpt), "--device", args.device, *args.serve_arg]
    rows = []
    server = LocalServer(serve)
    with server as url:
        for mode in args.modes:
            speaks = MODES[mode][1]
            run_mstar(url, bodies[mode][:1], args.tokens)  # warm-up of this mode, both sides
            run_hf(hf, reqs[mode][:1], speaks, args.tokens, args.frames, args.device, dtype)
            for c in args.concurrency:
                ours, theirs = [], []
                for _ in range(args.rounds):
                    ours.append(Cell(*run_mstar(url, bodies[mode][:c], args.tokens)))
                    theirs.append(Cell(*run_hf(hf, reqs[mode][:c], speaks, args.tokens, args.frames, args.device, dtype)))
                rows.append((mode, c, ours, theirs))
                line = (f"{mode} c={c}: req/s {fmt(med(ours, 'req_s'), med(theirs, 'req_s'), digits=2)}  "
                        f"tok/s {fmt(med(ours, 'tok_s'), med(theirs, 'tok_s'))}")
                if mode != "t2s":
                    line += f"  TTFT ms {fmt(med(ours, 'ttft'), med(theirs, 'ttft'), 1e3, lower_better=True, digits=0)}"
                if speaks:
                    line += (f"  TTFA ms {fmt(med(ours, 'ttfa'), med(theirs, 'ttfa'), 1e3, lower_better=True, digits=0)}"
                             f"  audio s/s {fmt(med(ours, 'audio_s'), med(theirs, 'audio_s'), digits=2)}"
                             f"  RTF {fmt(med(ours, 'rtf'), med(theirs, 'rtf'), lower_better=True, digits=2)}")
                if speaks:
                    line += (f"  audio/request {statistics.mean(t.audio_seconds for t in ours[0].timings):.3f} s"
                             f" / {statistics.mean(t.audio_seconds for t in theirs[0].timings):.3f} s")
                print(line, flush=True)
    stages = {}
    if args.stage_concurrency or args.check:
        engine = Engine.from_model("qwen3omni", weights=ckpt, device=args.device)
        for mode in args.modes:
            if args.check:
                print(f"{mode}: one request, mstar.Engine vs generate: "
                      f"{check_same_output(engine, hf, reqs[mode][0], MODES[mode][1], args.tokens, args.frames, args.device, dtype)}")
            if args.stage_concurrency:
                stage_shares(engine, reqs[mode][:1], args.tokens, args.frames)  # warm-up
                stages[mode] = stage_shares(engine, reqs[mode][: args.stage_concurrency], args.tokens, args.frames)
        engine.close()
    print_table(args, rows, stages)
    print(f"\nserver log {server.log_path}")
    if args.keep_checkpoint:
        print(f"checkpoint {ckpt}")
    else:
        shutil.rmtree(ckpt)


def print_table(args: argparse.Namespace, rows: list[Any], stages: dict[str, dict[str, tuple[float, int]]]) -> None:
    print(f"\nsize {args.size}, device {args.device}, {args.tokens} Thinker tokens, {args.frames} Talker frames "
          f"({(args.frames - 1) * 0.08:.2f} s of audio) per request, median of {args.rounds} round(s); "
          "cells: mstar / transformers (ratio, > 1: mstar better)\n")
    print("| mode | conc | req/s | tok/s | TTFT p50 ms | TTFA p50 ms | audio s/s | RTF p50 |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, c, ours, theirs in rows:
        speaks = MODES[mode][1]
        ttft = fmt(med(ours, "ttft"), med(theirs, "ttft"), 1e3, lower_better=True, digits=0) if mode != "t2s" else "-"
        ttfa = fmt(med(ours, "ttfa"), med(theirs, "ttfa"), 1e3, lower_better=True, digits=0) if speaks else "-"
        audio = fmt(med(ours, "audio_s"), med(theirs, "audio_s"), digits=2) if speaks else "-"
        rtf = fmt(med(ours, "rtf"), med(theirs, "rtf"), lower_better=True, digits=2) if speaks else "-"
        print(f"| {mode} | {c} | {fmt(med(ours, 'req_s'), med(theirs, 'req_s'), digits=2)} | "
              f"{fmt(med(ours, 'tok_s'), med(theirs, 'tok_s'))} | {ttft} | {ttfa} | {audio} | {rtf} |")
    if stages:
        print(f"\nstage shares of the in-process engine's busy time, {args.stage_concurrency} requests at once:\n")
        print("| mode | bound by | node: share of busy time (forwards) | node.walk: share (forwards) |")
        print("|---|---|---|---|")
        for mode, shares in stages.items():
            nodes = {k: v for k, v in shares.items() if "." not in k}
            walks = {k: v for k, v in shares.items() if "." in k}
            print(f"| {mode} | {next(iter(nodes))} | {', '.join(f'{k} {v:.0%} ({n})' for k, (v, n) in nodes.items())} | "
                  f"{', '.join(f'{k} {v:.0%} ({n})' for k, (v, n) in walks.items())} |")


if __name__ == "__main__":
    main()
