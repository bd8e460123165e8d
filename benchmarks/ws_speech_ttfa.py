"""Time to first audio of ``WS /v1/audio/speech/stream`` against ``POST /v1/audio/speech``
(streamed raw PCM) on the same server and sentences, interleaved round by round.

WS: measured from sending the message that completes a sentence (its stop and the space
after it) to the first binary frame, on one open socket. HTTP: from sending the request to
the first body byte. Both with the same seed and ``max_tokens``.

    .venv/bin/python benchmarks/ws_speech_ttfa.py --rounds 20          # toy, random weights
    .venv/bin/python benchmarks/ws_speech_ttfa.py --serve-args "--model orpheus --weights DIR"
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time

import httpx
from mstar.bench.local_server import LocalServer
from websockets.sync.client import connect


def http_ttfa(client: httpx.Client, url: str, model: str, text: str, settings: dict) -> float:
    body = {"model": model, "input": text, "response_format": "pcm", "stream_format": "audio", **settings}
    t0 = time.perf_counter()
    with client.stream("POST", f"{url}/v1/audio/speech", json=body) as resp:
        resp.raise_for_status()
        first = None
        for chunk in resp.iter_bytes():  # read to the end, as a player would
            if chunk and first is None:
                first = time.perf_counter() - t0
    return first if first is not None else float("nan")


def ws_ttfa(ws, text: str) -> float:
    head, tail = text[:-1], text[-1] + " "  # the last message completes the sentence
    ws.send(json.dumps({"type": "text", "text": head}))
    t0 = time.perf_counter()
    ws.send(json.dumps({"type": "text", "text": tail}))
    first = None
    while True:
        frame = ws.recv(timeout=120)
        if isinstance(frame, bytes):
            first = first if first is not None else time.perf_counter() - t0
        elif json.loads(frame)["type"] == "end":
            return first if first is not None else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve-args", default="--model toy --random-weights")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--voice", default=None)
    args = ap.parse_args()
    settings = {"seed": 1, "max_tokens": args.max_tokens, **({"voice": args.voice} if args.voice else {})}
    with LocalServer(shlex.split(args.serve_args)) as url, httpx.Client(timeout=120) as client:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", proxy=None) as ws:
            ws.send(json.dumps({"type": "session", "model": model, **settings}))
            ws_times, http_times = [], []
            for i in range(args.rounds + 2):  # two warm-up rounds
                text = f"This is sentence number {i} of the benchmark."
                w, h = ws_ttfa(ws, text), http_ttfa(client, url, model, text, settings)
                if i >= 2:
                    ws_times.append(w)
                    http_times.append(h)
    ws_ms, http_ms = statistics.median(ws_times) * 1000, statistics.median(http_times) * 1000
    print(f"rounds {args.rounds}: median TTFA  WS {ws_ms:.1f} ms  HTTP {http_ms:.1f} ms  ratio WS/HTTP {ws_ms / http_ms:.2f}")


if __name__ == "__main__":
    main()
