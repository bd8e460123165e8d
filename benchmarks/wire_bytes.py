"""Bytes between the API process and the engines per generated token and per second of
audio: what crosses the network when the engines sit on other nodes
(``--placement-backend ray``, docs/ray.md).

Serves MODEL's tiny random checkpoint in this process with one engine per graph node (so
every stream edge crosses engines, as in a two-node placement) and no shared memory (every
tensor inline, as between nodes), runs speech requests, and counts the bytes of every
message the API process sends to an engine (``EngineHandle.send``) and receives from one
(the report socket), secret frame included. ZMTP framing (a few bytes per frame) and
TCP/IP headers come on top. Message sizes depend on the signals' shapes (token ids, codes,
audio samples), which a random checkpoint shares with the real one.

    python benchmarks/wire_bytes.py toy orpheus qwen3tts --max-tokens 200
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import tempfile
from pathlib import Path
from typing import Any

import yaml


def _one_group_per_node(rt_graph: Any) -> str:
    return yaml.safe_dump({"groups": {f"g_{node}": {"device": "cpu", "nodes": [node]} for node in rt_graph.nodes}})


async def measure(model: str, max_tokens: int, requests: int) -> dict[str, Any]:
    import msgspec
    import mstar.server.runtime as runtime_mod
    from mstar.api.adapter import SPEECH
    from mstar.api.protocol import SpeechRequest
    from mstar.api.sampling import request_sampling
    from mstar.server.config import ServerConfig
    from mstar.server.engine_handle import EngineHandle
    from mstar.server.execution import Execution
    from mstar.server.launcher import resolve_checkpoint
    from mstar.server.messages import report_decoder
    from mstar.server.ray_engines import NO_SHM
    from mstar.server.runtime import ServerRuntime

    config = ServerConfig(model=model, random_weights=True, preprocess_workers=0, shm_threshold=NO_SHM, restart_engines=False)
    ckpt = resolve_checkpoint(config)
    probe = ServerRuntime(config, ckpt)
    placement = Path(tempfile.mkdtemp(prefix="wire-bytes-")) / "placement.yaml"
    placement.write_text(_one_group_per_node(probe.graph))
    probe.close()
    config.placement = str(placement)

    counts: collections.Counter[str] = collections.Counter()
    payload: collections.Counter[str] = collections.Counter()
    send, authenticated = EngineHandle.send, runtime_mod.authenticated

    def counting_send(self: EngineHandle, cmd: Any) -> None:
        counts[f"to engines: {type(cmd).__name__}"] += len(self.spec.secret) + len(msgspec.msgpack.encode(cmd))
        send(self, cmd)

    def counting_authenticated(frames: list[bytes], secret: bytes, where: str) -> bytes | None:
        raw = authenticated(frames, secret, where)
        if raw is not None:
            report = report_decoder.decode(raw)
            counts[f"from engines: {type(report).__name__}"] += sum(map(len, frames))
            for ev in getattr(report, "events", ()):  # the tensor payload by signal (in the total above)
                if ev.value is not None:
                    kind = "stream item" if ev.stream_item else "output"
                    payload[f"{kind} {ev.signal}"] += len(ev.value.data)
        return raw

    EngineHandle.send = counting_send  # type: ignore[method-assign]
    runtime_mod.authenticated = counting_authenticated  # type: ignore[assignment]
    rt = ServerRuntime(config, ckpt)
    try:
        await rt.start()
        counts.clear()
        payload.clear()
        voice = next(iter(rt.adapter.voices()), None)
        tokens = samples = 0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(requests):
            req = SpeechRequest(model=model, input=f"Measuring the wire, request {i}.", voice=voice.name if voice else None,
                                max_tokens=max_tokens, ignore_eos=True, seed=i)
            ex = Execution(rt, SPEECH)
            await ex.start(req, request_sampling(req, max_tokens=("max_tokens", max_tokens)), None)
            try:
                async for batch in ex.batches():
                    for signal, value in batch:
                        if signal == rt.adapter.audio_signal:
                            samples += value.numel()
                        elif signal == "token":
                            tokens += value.numel()
                        elif signal == "codes":  # a codec frame per LM step (one row each)
                            tokens += value.shape[0] if value.dim() > 1 else 1
            finally:
                ex.close()
        elapsed = loop.time() - t0
        return {"model": model, "counts": dict(counts), "payload": dict(payload), "sample_rate": rt.adapter.sample_rate, "tokens": tokens, "audio_s": samples / (rt.adapter.sample_rate or 1),
                "elapsed_s": elapsed, "engines": len(rt.engines)}
    finally:
        await rt.stop()
        EngineHandle.send, runtime_mod.authenticated = send, authenticated  # type: ignore[method-assign]


def report(r: dict[str, Any]) -> None:
    counts = r["counts"]
    per_request = sum(v for k, v in counts.items() if not k.endswith(": Stats"))
    stats = sum(v for k, v in counts.items() if k.endswith(": Stats"))
    print(f"== {r['model']}: {r['tokens']} tokens, {r['audio_s']:.2f} s of audio, {r['engines']} engines, {r['elapsed_s']:.1f} s")
    for key, value in sorted(counts.items()):
        print(f"   {key:32s} {value:>12,d} B")
    for key, value in sorted(r["payload"].items()):
        print(f"     of which tensor bytes, {key:18s} {value:>10,d} B")
    print(f"   request traffic (without Stats): {per_request:,d} B")
    if r["tokens"]:
        print(f"   per LM step (token or codec frame): {per_request / r['tokens']:,.0f} B")
    if r["audio_s"] and r["tokens"]:
        print(f"   audio samples per LM step: {r['audio_s'] * (r['sample_rate'] or 0) / r['tokens']:,.0f} (at {r['sample_rate']} Hz)")
    if r["audio_s"]:
        print(f"   per second of audio:      {per_request / r['audio_s']:,.0f} B ({per_request * 8 / r['audio_s'] / 1e6:.2f} Mbit/s at real time)")
    print(f"   Stats reports (time-based, all engines): {stats / r['elapsed_s']:,.0f} B/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--requests", type=int, default=2)
    args = parser.parse_args()
    for model in args.models:
        report(asyncio.run(measure(model, args.max_tokens, args.requests)))


if __name__ == "__main__":
    main()
