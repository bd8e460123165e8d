"""Orpheus TTS: time to first audio and real-time factor, ``mstar serve`` vs the reference
pipeline (transformers ``generate`` streaming tokens into the official Orpheus decoder over
``snac``, the way the official package runs), at concurrency 1 and 8, in one run.

    .venv/bin/python benchmarks/orpheus_tts.py [--tokens 91 --snac mid|released --device cpu --split]
        [--threads 1] [--baseline] [--repeats 3]

``--split`` also serves the LM and SNAC in two engine processes; ``--baseline`` also serves
with the earlier default (``overlap_nodes`` off: SNAC windows decode after the LM's step
instead of beside it); ``--threads`` sets torch's threads of the reference and of every
engine process (on a shared machine, 1 avoids OpenMP teams spinning over each other).

The checkpoint is random and mid-sized (4 layers, hidden 512, the real 156,940-token
vocabulary; audio-steered so it emits audio tokens). ``--snac mid`` uses a SNAC decoder of
width 256 (the released 1024-wide one costs ~0.5 s per window on a small CPU, which would
dominate both sides equally). Both pipelines sample with Orpheus's defaults
(temperature 0.6, top_p 0.8, repetition_penalty 1.3, no top-k) and run to ``--tokens``
tokens. Rounds are interleaved and the median run is reported, as the machine may be shared.

RTF = wall time of a request / seconds of audio it produced (lower is better);
throughput = audio seconds produced per wall second over the whole batch.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch
from mstar.bench import BenchRequest, RunOptions
from mstar.bench import run as bench_run

SAMPLE_RATE = 24000
WINDOW_SAMPLES = 2048
VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech should start before the sentence is finished.",
    "How many windows of audio fit into one second?",
    "Benchmarks are ratios, measured in one run.",
    "A mid-sized random model still speaks in codes.",
    "Seven tokens make one frame of audio.",
    "Twenty-eight tokens make the first window.",
    "Concurrency eight shares one forward pass.",
]


SPLIT_PLACEMENT = """
groups:
  lm_group: {{device: {device}, nodes: [lm]}}
  codec_group: {{device: {device}, nodes: [snac]}}
"""


@dataclass
class RequestStats:
    ttfa: float  # seconds to the first audio
    total: float  # seconds to the last audio
    audio_s: float

    @property
    def rtf(self) -> float:
        return self.total / self.audio_s if self.audio_s else float("inf")


@dataclass
class RunStats:
    requests: list[RequestStats]
    wall: float

    @property
    def ttfa(self) -> float:
        return statistics.mean(r.ttfa for r in self.requests)

    @property
    def rtf(self) -> float:
        return statistics.mean(r.rtf for r in self.requests)

    @property
    def throughput(self) -> float:
        return sum(r.audio_s for r in self.requests) / self.wall


def write_checkpoint(path: Path, snac: str, codec_batch: int | None = None) -> Path:
    from mstar_orpheus.checkpoint import SNAC_24KHZ, write_checkpoint

    # SNAC rows per call (mstar only): None keeps the plugin's default (8 on CUDA, 1 elsewhere).
    extra = {} if codec_batch is None else {"mstar_codec_batch": codec_batch}

    snac_config = SNAC_24KHZ if snac == "released" else {**SNAC_24KHZ, "decoder_dim": 256}
    return write_checkpoint(
        path, seed=0, hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, snac=snac_config, **extra,
    )


# ---- mstar serve ---------------------------------------------------------------------------


class Server:
    def __init__(self, ckpt: Path, device: str, port: int, split: bool, extra: tuple[str, ...] = ()) -> None:
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "mstar.cli", "serve", "--model", "orpheus", "--weights", str(ckpt),
               "--port", str(port), "--device", device, "--log-level", "warning", *extra]
        if split:  # the LM and the SNAC decoder in two engine processes, overlapping in time
            placement = ckpt.parent / "split.yaml"
            placement.write_text(SPLIT_PLACEMENT.format(device=device))
            cmd += ["--config", str(placement)]
        self.log = tempfile.NamedTemporaryFile(prefix="orpheus-bench-", suffix=".log", delete=False)  # noqa: SIM115 (lives with the server)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mstar serve exited; see {self.log.name}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"mstar serve did not become healthy; see {self.log.name}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def run_mstar(server: Server, concurrency: int, tokens: int) -> RunStats:
    """``concurrency`` requests at once through ``mstar bench``'s client (raw PCM streams)."""
    requests = [
        BenchRequest("speech", {"input": TEXTS[i % len(TEXTS)], "voice": VOICES[i % len(VOICES)], "max_tokens": tokens, "seed": 100 + i})
        for i in range(concurrency)
    ]
    result = bench_run(requests, RunOptions(server.url, model="orpheus", speech_format="audio"))
    failed = [r.error for r in result.records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} request(s) failed: {failed[0]}")
    stats = [RequestStats(r.first_output if r.first_output is not None else r.latency, r.latency, r.audio_seconds) for r in result.records]
    return RunStats(stats, result.duration)


# ---- the reference pipeline ----------------------------------------------------------------


class _TokenQueue:
    """A ``transformers`` streamer handing each step's [B] new tokens to the decoder thread."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate() first puts the prompt
            self.prompt_seen = True
            return
        self.q.put(value.reshape(-1).tolist())

    def end(self) -> None:
        self.q.put(None)


class OfficialDecoder:
    """The official streaming rule for one request: custom-token index - 10 - (count mod 7)
    * 4096, kept when > 0; every 7 codes from the 28th, decode the last 28 with snac and
    keep samples 2048:4096."""

    def __init__(self, snac, base: int, end_of_speech: int) -> None:
        self.snac, self.base, self.eos = snac, base, end_of_speech
        self.codes: list[int] = []
        self.samples = 0
        self.done = False

    def push(self, token: int) -> bool:
        """Feed one token; True when it produced audio."""
        if self.done:
            return False
        if token == self.eos:
            self.done = True
            return False
        code = token - self.base - 10 - (len(self.codes) % 7) * 4096
        if token < self.base or code <= 0:
            return False
        self.codes.append(code)
        if len(self.codes) % 7 or len(self.codes) < 28:
            return False
        w = self.codes[-28:]
        levels = [[w[7 * f] for f in range(4)], [w[7 * f + i] for f in range(4) for i in (1, 4)],
                  [w[7 * f + i] for f in range(4) for i in (2, 3, 5, 6)]]
        if any(not 0 <= c < 4096 for lv in levels for c in lv):
            return False
        with torch.inference_mode():
            audio = self.snac.decode([torch.tensor([lv]) for lv in levels])[:, :, 2048:4096]
        self.pcm = (audio.cpu().numpy() * 32767).astype(np.int16)  # as the official decoder
        self.samples += WINDOW_SAMPLES
        return True


class Reference:
    def __init__(self, ckpt: Path, device: str) -> None:
        from snac import SNAC
        from transformers import AutoTokenizer, LlamaForCausalLM

        self.device = device
        self.model = LlamaForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(ckpt))
        self.snac = SNAC.from_pretrained(str(ckpt / "snac")).eval().to(device)
        self.base = self.tokenizer.convert_tokens_to_ids("<custom_token_0>")
        self.special = [self.tokenizer.convert_tokens_to_ids(f"<custom_token_{i}>") for i in range(6)]

    def prompt(self, text: str, voice: str) -> list[int]:
        _, sos, eos, soh, eoh, soa = self.special
        return [soh, *self.tokenizer(f"{voice}: {text}").input_ids, self.tokenizer.convert_tokens_to_ids("<|eot_id|>"), eoh, soa, sos]

    def run(self, concurrency: int, tokens: int) -> RunStats:
        prompts = [self.prompt(TEXTS[i % len(TEXTS)], VOICES[i % len(VOICES)]) for i in range(concurrency)]
        width = max(map(len, prompts))
        pad = self.special[2]
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        streamer = _TokenQueue()
        decoders = [OfficialDecoder(self.snac, self.base, self.special[2]) for _ in prompts]
        first: list[float | None] = [None] * concurrency
        last = [0.0] * concurrency
        start = time.perf_counter()

        def generate() -> None:
            with torch.inference_mode():
                self.model.generate(
                    # top_k=0: transformers' implicit top_k=50 off, so both sides sample the same
                    # distribution (as vLLM does in the official package).
                    input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.6, top_p=0.8, top_k=0, repetition_penalty=1.3,
                    max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=self.special[2], pad_token_id=pad, streamer=streamer,
                )

        producer = threading.Thread(target=generate)
        producer.start()
        while (step := streamer.q.get()) is not None:
            for i, tok in enumerate(step):
                if decoders[i].push(tok):
                    now = time.perf_counter() - start
                    first[i] = now if first[i] is None else first[i]
                    last[i] = now
        producer.join()
        wall = time.perf_counter() - start
        stats = [RequestStats(f if f is not None else wall, t or wall, d.samples / SAMPLE_RATE) for f, t, d in zip(first, last, decoders, strict=True)]
        return RunStats(stats, wall)


# ---- main ----------------------------------------------------------------------------------


def _median_run(runs: list[RunStats]) -> RunStats:
    """The run with the median wall time (the machine may be shared: runs are repeated)."""
    return sorted(runs, key=lambda r: r.wall)[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=91, help="tokens per request (91: ten SNAC windows)")
    parser.add_argument("--snac", choices=["mid", "released"], default="mid")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the median run is reported")
    parser.add_argument("--split", action="store_true", help="also serve with the LM and SNAC in two engine processes")
    parser.add_argument("--codec-batch", type=int, default=None, help="SNAC windows per call (default: 8 on CUDA, 1 on CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the reference and of each engine process")
    parser.add_argument("--baseline", action="store_true", help="also serve with the earlier default (SNAC after the LM, not beside it)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    extra = ("--engine-threads", str(args.threads)) if args.threads else ()

    runs: dict[tuple[str, int], list[RunStats]] = {}
    with tempfile.TemporaryDirectory(prefix="orpheus-bench-") as tmp:
        ckpt = write_checkpoint(Path(tmp) / "ckpt", args.snac, args.codec_batch)
        servers = {"mstar": Server(ckpt, args.device, 8765, split=False, extra=extra)}
        if args.split:
            servers["mstar-split"] = Server(ckpt, args.device, 8766, split=True, extra=extra)
        if args.baseline:
            servers["mstar-old"] = Server(ckpt, args.device, 8767, split=False, extra=(*extra, "--engine-option", "overlap_nodes=false"))
        try:
            reference = Reference(ckpt, args.device)
            reference.run(1, 35)  # warm-up
            for server in servers.values():
                run_mstar(server, 1, 35)
            # Interleaved rounds, so load from anything else on the machine hits every pipeline alike.
            for _ in range(args.repeats):
                for c in args.concurrency:
                    runs.setdefault(("reference", c), []).append(reference.run(c, args.tokens))
                    for name, server in servers.items():
                        runs.setdefault((name, c), []).append(run_mstar(server, c, args.tokens))
        finally:
            for server in servers.values():
                server.close()

    results = {k: _median_run(v) for k, v in runs.items()}
    print(f"\nOrpheus TTS, {args.tokens} tokens/request, SNAC {args.snac}, device {args.device}, "
          f"torch threads {torch.get_num_threads()}, median of {args.repeats}")
    print(f"{'pipeline':<12} {'conc':>4} {'TTFA s':>8} {'RTF':>7} {'audio s/s':>10} {'wall s':>7}")
    for (name, c), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{name:<12} {c:>4} {r.ttfa:>8.3f} {r.rtf:>7.3f} {r.throughput:>10.3f} {r.wall:>7.2f}")
    print("\nratios vs the reference (> 1: mstar is better): TTFA ref/mstar, RTF ref/mstar, throughput mstar/ref")
    for c in args.concurrency:
        ref = results[("reference", c)]
        for name in servers:
            m = results[(name, c)]
            print(f"  {name:<12} concurrency {c}: TTFA x{ref.ttfa / m.ttfa:.2f}, RTF x{ref.rtf / m.rtf:.2f}, "
                  f"throughput x{m.throughput / ref.throughput:.2f}")


if __name__ == "__main__":
    main()
