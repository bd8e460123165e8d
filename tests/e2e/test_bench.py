"""``mstar bench`` against a real ``mstar serve --model toy --random-weights`` on loopback:
the JSON result counts every request sent, its percentiles are ordered, and its token
counts and audio lengths equal what the server returns for the same requests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from mstar.bench import RunOptions, jsonl_requests, random_requests, run, summarize

pytestmark = pytest.mark.e2e

PROMPTS = ["Hello there", "Tell me a story about a fox", "What is two plus two?", "Hi", "Write a long poem about the sea", "Bye"]


def _server_process_class():
    # The e2e conftest's ServerProcess, loaded by path (conftest modules share one name).
    spec = importlib.util.spec_from_file_location("bench_e2e_server", Path(__file__).with_name("conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("home")  # --random-weights writes its checkpoint under ~/.cache
    srv = _server_process_class()(
        ["--model", "toy", "--random-weights", "--preprocess-workers", "1", "--log-level", "warning"],
        tmp_path_factory.mktemp("bench-server") / "server.log", env={**os.environ, "HOME": str(home)},
    )
    srv.start()
    yield srv
    try:
        srv.stop()
    finally:
        srv.kill_all()


def _ordered(summary: dict, metric: str, unit: str = "_ms") -> None:
    p50, p90, p99 = (summary[f"p{p}_{metric}{unit}"] for p in (50, 90, 99))
    assert 0 <= p50 <= p90 <= p99, (metric, p50, p90, p99)


def test_cli_chat_result_file_counts_and_tokens_match_the_server(server, tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    result = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "mstar.cli", "bench", "--base-url", server.url, "--dataset-name", "jsonl",
           "--dataset-path", str(data), "--num-prompts", "8", "--random-output-len", "12", "--temperature", "0",
           "--max-concurrency", "3", "--num-warmups", "2", "--result-file", str(result), "--save-detailed", "--disable-tqdm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Successful requests:" in proc.stdout and "P99 TTFT (ms):" in proc.stdout
    doc = json.loads(result.read_text())
    assert (doc["requests"], doc["completed"], doc["failed"]) == (8, 8, 0)
    details = doc["requests_detail"]
    assert len(details) == 8 and all(d["ok"] and d["status"] == 200 for d in details)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        _ordered(doc, metric)
    # Every request again, whole and greedy: the server's own counts equal the benchmark's.
    for i, detail in enumerate(details):
        body = {"model": "toy", "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "max_tokens": 12, "temperature": 0}
        usage = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()["usage"]
        assert (detail["prompt_tokens"], detail["output_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
        assert 1 <= len(detail["chunk_times"]) <= detail["output_tokens"]
        assert detail["chunk_times"] == sorted(detail["chunk_times"]) and detail["chunk_times"][-1] <= detail["latency"]
    assert doc["total_output_tokens"] == sum(d["output_tokens"] for d in details)
    assert doc["total_input_tokens"] == sum(d["prompt_tokens"] for d in details)
    assert doc["output_throughput"] == pytest.approx(doc["total_output_tokens"] / doc["duration"])


@pytest.mark.parametrize("fmt", ["audio", "sse"])
def test_speech_poisson_audio_seconds_match_whole_responses(server, fmt: str) -> None:
    reqs = random_requests("speech", 6, input_words=4, max_tokens=10, seed=5)
    reqs = [type(r)(r.workload, {**r.body, "seed": 100 + i}) for i, r in enumerate(reqs)]
    bench = run(reqs, RunOptions(server.url, request_rate=20.0, seed=1, speech_format=fmt, warmups=1))
    summary = summarize(bench)
    assert (summary["requests"], summary["completed"], summary["failed"]) == (6, 6, 0)
    for metric, unit in (("ttfa", "_ms"), ("rtf", ""), ("e2el", "_ms")):
        _ordered(summary, metric, unit)
    for req, rec in zip(reqs, bench.records, strict=True):
        whole = httpx.post(f"{server.url}/v1/audio/speech", json={"model": "toy", **req.body, "response_format": "pcm"}, timeout=60)
        rate = int(whole.headers["x-sample-rate"])
        assert rec.audio_seconds == pytest.approx(len(whole.content) / 2 / rate, abs=1e-12)
        assert rec.audio_seconds > 0 and 0 < rec.first_output <= rec.latency
    assert summary["total_audio_seconds"] == pytest.approx(sum(r.audio_seconds for r in bench.records))
    assert summary["mean_rtf"] == pytest.approx(sum(r.latency / r.audio_seconds for r in bench.records) / 6)


def test_cli_exits_1_when_no_request_completed(server, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "mstar.cli", "bench", "--base-url", server.url, "--model", "no-such-model",
           "--num-prompts", "3", "--random-output-len", "4", "--num-warmups", "0", "--disable-tqdm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "none of the 3 requests completed" in proc.stderr


def test_every_failed_request_is_counted(server, tmp_path: Path) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    reqs = jsonl_requests("chat", data, num=5, max_tokens=4)
    bench = run(reqs, RunOptions(server.url, model="no-such-model", max_concurrency=2))
    summary = summarize(bench)
    assert (summary["requests"], summary["completed"], summary["failed"]) == (5, 0, 5)
    assert all(r.status == 404 and "no-such-model" in r.error for r in bench.records)


def test_local_server_serves_then_stops(tmp_path: Path) -> None:
    from mstar.bench import LocalServer

    server = LocalServer(["--model", "toy", "--random-weights", "--preprocess-workers", "1"], env={**os.environ, "HOME": str(tmp_path)})
    with server as url:
        reqs = random_requests("chat", 3, input_words=3, max_tokens=4, ignore_eos=True)
        summary = summarize(run(reqs, RunOptions(url)))
        assert (summary["completed"], summary["total_output_tokens"]) == (3, 12)
    assert server.proc is not None and server.proc.returncode == 0
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=2)
