"""Soak test: N clients stream requests at an ``mstar serve`` for T minutes.

Every client loops: a streamed chat completion (models with chat) or a streamed speech
request (models with speech), alternating where a model has both, each read to its end and
checked for a clean end (``[DONE]`` / ``speech.audio.done`` / a complete body). Per minute it
reports the requests finished, errors (any non-200, error event, cut stream or transport
error), latency percentiles (p50/p90/p99 of the whole request) and the resident memory of
every process of the server (the API process and its children). At the end it judges each
process's memory: flat when the highest RSS of the run's second half is at most
``--flat-tolerance`` (default 10%) above the highest of its first half; a process that did not
live through both halves (e.g. a restarted engine) is reported as such.

    # against a server it starts (random weights, loopback):
    python benchmarks/soak.py --model toy --clients 32 --minutes 10
    # against a running server:
    python benchmarks/soak.py --url http://127.0.0.1:8000 --server-pid PID --clients 32 --minutes 10

``--json FILE`` writes the per-minute rows and the verdicts. It exits 1 on any error or memory
that is not flat. Numbers on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


@dataclass
class Minute:
    done: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    error_kinds: dict[str, int] = field(default_factory=dict)
    first_errors: dict[str, str] = field(default_factory=dict)  # kind -> UTC time and message of its first


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_by_process(root_pid: int) -> dict[str, float]:
    """MiB resident per process of the server: the root and every descendant."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out: dict[str, float] = {}
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        out[f"{pid}:{name}"] = rss / 1024
        todo.extend(children.get(pid, []))
    return out


async def chat_once(http: httpx.AsyncClient, model: str, rng: random.Random) -> str | None:
    body = {"model": model, "messages": [{"role": "user", "content": f"soak {rng.random():.6f}"}],
            "max_tokens": rng.randint(8, 64), "stream": True, "seed": rng.randint(0, 2**31)}
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return f"http {r.status_code}"
        last = None
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                last = line[6:]
                if last != "[DONE]" and '"error"' in last and '"choices"' not in last:
                    return "error event"
        return None if last == "[DONE]" else "no [DONE]"


async def speech_once(http: httpx.AsyncClient, model: str, rng: random.Random, voice: str) -> str | None:
    body = {"model": model, "input": f"Soak test sentence {rng.randint(0, 999)}.", "voice": voice,
            "response_format": "pcm", "stream_format": "sse", "max_tokens": rng.randint(16, 96), "seed": rng.randint(0, 2**31)}
    async with http.stream("POST", "/v1/audio/speech", json=body) as r:
        if r.status_code != 200:
            return f"http {r.status_code}"
        last: dict[str, Any] | None = None
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                if last.get("type") == "error":
                    return "error event"
        return None if last is not None and last.get("type") == "speech.audio.done" else "no speech.audio.done"


async def client(i: int, url: str, model: str, endpoints: list[str], voice: str, until: float, t0: float, minutes: list[Minute]) -> None:
    rng = random.Random(i)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        n = 0
        while time.monotonic() < until:
            start = time.monotonic()
            kind = endpoints[n % len(endpoints)]
            n += 1
            detail = ""
            try:
                err = await (chat_once(http, model, rng) if kind == "chat" else speech_once(http, model, rng, voice))
            except httpx.HTTPError as exc:
                err, detail = f"transport {type(exc).__name__}", repr(exc)
            end = time.monotonic()
            m = minutes[min(int((end - t0) // 60), len(minutes) - 1)]
            m.done += 1
            m.latencies.append(end - start)
            if err:
                m.errors += 1
                m.error_kinds[err] = m.error_kinds.get(err, 0) + 1
                m.first_errors.setdefault(err, f"{time.strftime('%H:%M:%S', time.gmtime())} UTC client {i} {kind} {detail}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, extra: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "mstar.cli", "serve", "--model", model, "--random-weights", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited during start-up; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server not healthy after 600 s; see {log}")


def memory_verdicts(rows: list[dict[str, Any]], tolerance: float) -> dict[str, dict[str, Any]]:
    """Per process: the highest RSS of the first and second half of the minutes and whether
    the second stays within ``tolerance`` (a fraction) of the first. Needs two minutes."""
    half = len(rows) // 2
    first, second = rows[:half], rows[half:]
    names = {name for row in rows for name in row["rss_mib"]}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(names):
        a = [row["rss_mib"][name] for row in first if name in row["rss_mib"]]
        b = [row["rss_mib"][name] for row in second if name in row["rss_mib"]]
        if not a or not b:
            out[name] = {"flat": None, "why": "not alive in both halves"}
            continue
        limit = max(a) * (1 + tolerance)
        out[name] = {"flat": max(b) <= limit, "first_max_mib": max(a), "second_max_mib": max(b), "limit_mib": limit}
    return out


async def soak(url: str, pid: int, clients: int, minutes: int, voice: str) -> list[dict[str, Any]]:
    version = httpx.get(f"{url}/version", timeout=10).json()
    model = version["model"]
    endpoints = [e for e in ("chat", "speech") if e in version["endpoints"]]
    rows: list[Minute] = [Minute() for _ in range(minutes)]
    t0 = time.monotonic()
    until = t0 + 60 * minutes
    tasks = [asyncio.create_task(client(i, url, model, endpoints, voice, until, t0, rows)) for i in range(clients)]
    report: list[dict[str, Any]] = []
    for minute in range(minutes):
        await asyncio.sleep(max(0.0, t0 + 60 * (minute + 1) - time.monotonic()))
        m = rows[minute]
        memory = rss_by_process(pid) if pid else {}
        row = {"minute": minute + 1, "model": model, "clients": clients, "done": m.done, "errors": m.errors,
               "error_kinds": m.error_kinds, "first_errors": m.first_errors, "p50_s": percentile(m.latencies, 0.5), "p90_s": percentile(m.latencies, 0.9),
               "p99_s": percentile(m.latencies, 0.99), "rss_mib": memory, "rss_total_mib": sum(memory.values())}
        report.append(row)
        print(f"min {row['minute']:>2}  {model}  done {m.done:>6}  errors {m.errors:>4}  p50 {row['p50_s']:.3f}s  "
              f"p90 {row['p90_s']:.3f}s  p99 {row['p99_s']:.3f}s  rss {row['rss_total_mib']:.0f} MiB "
              + " ".join(f"{k}={v:.0f}" for k, v in memory.items()), flush=True)
    await asyncio.gather(*tasks)
    # Requests that ended after the last full minute are counted in it.
    if report:
        last = rows[-1]
        report[-1].update(done=last.done, errors=last.errors, error_kinds=last.error_kinds, first_errors=last.first_errors)
    for row in report:
        for err, first in row["first_errors"].items():
            print(f"minute {row['minute']}: {row['error_kinds'][err]} x {err}; first at {first}")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (else one is started with --model)")
    ap.add_argument("--server-pid", type=int, default=0, help="PID of the running server's API process (for memory)")
    ap.add_argument("--model", default="toy", help="model to serve with --random-weights when no --url")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for mstar serve (repeatable)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--voice", default="alloy", help="speech voice (model-specific names, e.g. tara, ryan)")
    ap.add_argument("--json", type=Path, help="write the per-minute rows and the memory verdicts here")
    ap.add_argument("--flat-tolerance", type=float, default=0.10,
                    help="memory is flat when the second half's highest RSS is at most this fraction above the first half's")
    ap.add_argument("--server-log", type=Path, help="the started server's log (default: a file in the temp directory)")
    args = ap.parse_args()
    proc = None
    url, pid = args.url, args.server_pid
    if url is None:
        log = args.server_log or Path(tempfile.gettempdir()) / f"soak-{args.model}-server.log"
        print(f"server log: {log}", flush=True)
        proc, url = start_server(args.model, args.serve_arg, log)
        pid = proc.pid
    try:
        report = asyncio.run(soak(url, pid, args.clients, args.minutes, args.voice))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    verdicts = memory_verdicts(report, args.flat_tolerance) if len(report) >= 2 and pid else {}
    for name, v in verdicts.items():
        if v["flat"] is None:
            print(f"memory {name}: {v['why']}")
        else:
            print(f"memory {name}: {'flat' if v['flat'] else 'NOT flat'} (max {v['first_max_mib']:.0f} MiB in the first half, "
                  f"{v['second_max_mib']:.0f} MiB in the second; limit {v['limit_mib']:.0f} MiB)")
    if args.json:
        args.json.write_text(json.dumps({"minutes": report, "memory": verdicts}, indent=1))
    errors = sum(r["errors"] for r in report)
    not_flat = [name for name, v in verdicts.items() if v["flat"] is False]
    print(f"total: {sum(r['done'] for r in report)} requests, {errors} errors, memory "
          + (f"NOT flat in {', '.join(not_flat)}" if not_flat else "flat" if verdicts else "not judged"))
    raise SystemExit(1 if errors or not_flat else 0)


if __name__ == "__main__":
    main()
