"""Replicated placement groups behind a real server: outputs equal the in-process engine
(what the unreplicated server gives, tests/e2e/test_server_placement.py), the default policy
spreads concurrent requests over the replicas, a routing plugin (a real distribution,
installed) routes as it says, and a killed replica fails only its own requests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from conftest import with_site

pytestmark = pytest.mark.e2e

ROUTE_PLUGIN = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "route_modality"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]

# Both groups replicated: a request's codes must reach its own decoder replica.
SPREAD = """
groups:
  lm_g: {device: cpu, nodes: [lm], replicas: 2}
  dec_g: {device: cpu, nodes: [decoder], replicas: 2}
"""
# One group, both nodes, a device per replica.
MODALITY = """
groups:
  both: {devices: [cpu, cpu], nodes: [lm, decoder]}
"""
REQUESTS = [
    ("replicas", {"temperature": 0, "seed": 77, "max_tokens": 30}),
    ("seeded sampling", {"temperature": 1.0, "top_k": 50, "seed": 1234, "max_tokens": 40}),
]
# Long enough to be running on both replicas at once.
CONCURRENT = [(f"spread {i}", {"temperature": 0.9, "seed": 100 + i, "max_tokens": 400, "ignore_eos": True}) for i in range(4)]


def generate_body(text: str, sampling: dict) -> dict:
    return {"model": "toy", "inputs": {"prompt_ids": [256, *text.encode()]}, "sampling": sampling}


def outputs(out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    from mstar.api.tensors import tensor_from_json

    return tensor_from_json(out["outputs"]["token"], "token"), tensor_from_json(out["outputs"]["audio"], "audio")


def replica_requests(server, group: str) -> list[float]:
    return [server.metric("mstar_engine_requests", engine=group, replica=str(i)) for i in range(2)]


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture(scope="module")
def reference(toy_checkpoint):
    from mstar import Engine

    # One torch thread, as the servers' engines (--engine-threads 1): on some CPUs the
    # decoder's audio differs in its last bits between thread counts.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Engine.from_model("toy", weights=toy_checkpoint) as engine:
            outs = engine.run_batch(
                [{"inputs": {"prompt_ids": torch.tensor([256, *text.encode()])}, "sampling": s} for text, s in REQUESTS + CONCURRENT]
            )
    finally:
        torch.set_num_threads(threads)
    return [(o.cat("token"), o.cat("audio")) for o in outs]


def placement_file(tmp_path_factory, text: str) -> str:
    path = tmp_path_factory.mktemp("replicas") / "placement.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def spread(start_server, tmp_path_factory):
    srv = start_server(["--config", placement_file(tmp_path_factory, SPREAD), "--preprocess-workers", "0", "--engine-threads", "1"])
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0, srv.log_tail()
    srv.assert_clean_exit()


def pip(args: list[str]) -> None:
    proc = subprocess.run([*PIP, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def route_site(tmp_path_factory) -> Path:
    """The route-by-modality fixture plugin, built and pip-installed into a site of its own."""
    root = tmp_path_factory.mktemp("route-plugin")
    src = root / "src"  # a copy: setuptools' build/ and egg-info never litter the repo
    shutil.copytree(ROUTE_PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip(["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(root / "wheels"), str(src)])
    pip(["install", "--no-deps", "--no-index", "--target", str(root / "site"), *map(str, (root / "wheels").glob("*.whl"))])
    return root / "site"


@pytest.fixture(scope="module")
def modality(start_server, tmp_path_factory, route_site):
    srv = start_server(
        ["--config", placement_file(tmp_path_factory, MODALITY), "--preprocess-workers", "0", "--engine-threads", "1"],
        env=with_site(route_site),
    )
    yield srv
    srv.kill_all()


# ---- the default policy ----------------------------------------------------------------------
def test_each_replica_is_an_engine_process(spread):
    health = spread.health().json()
    assert health["status"] == "ok"
    engines = {name: (e["group"], e["replica"], e["nodes"]) for name, e in health["engines"].items()}
    assert engines == {
        "lm_g/0": ("lm_g", 0, ["lm"]), "lm_g/1": ("lm_g", 1, ["lm"]),
        "dec_g/0": ("dec_g", 0, ["decoder"]), "dec_g/1": ("dec_g", 1, ["decoder"]),
    }
    assert len({e["pid"] for e in health["engines"].values()}) == 4
    assert spread.metric("mstar_engine_up", engine="dec_g", replica="1") == 1
    # The warm-up ran on each replica (pinned) before the port opened: alone, then as two copies at once.
    assert wait_for(lambda: replica_requests(spread, "lm_g") == replica_requests(spread, "dec_g") == [3, 3]), replica_requests(spread, "lm_g")


@pytest.mark.parametrize("i", range(len(REQUESTS)))
def test_outputs_match_unreplicated(spread, reference, i):
    before = replica_requests(spread, "lm_g")
    out = httpx.post(f"{spread.url}/v1/generate", json=generate_body(*REQUESTS[i]), timeout=60).json()
    tokens, audio = outputs(out)
    assert torch.equal(tokens, reference[i][0])
    assert torch.equal(audio, reference[i][1])
    # One at a time: nothing outstanding anywhere, so the tie goes to replica 0.
    assert wait_for(lambda: replica_requests(spread, "lm_g") == [before[0] + 1, before[1]]), replica_requests(spread, "lm_g")


def test_concurrent_requests_spread_over_replicas(spread, reference):
    before = {g: replica_requests(spread, g) for g in ("lm_g", "dec_g")}

    def post(item):
        return httpx.post(f"{spread.url}/v1/generate", json=generate_body(*item), timeout=120).json()

    with ThreadPoolExecutor(len(CONCURRENT)) as pool:
        outs = list(pool.map(post, CONCURRENT))
    for out, (tokens, audio) in zip(outs, reference[len(REQUESTS):], strict=True):
        got_tokens, got_audio = outputs(out)
        assert torch.equal(got_tokens, tokens)
        assert torch.equal(got_audio, audio)
    # Least outstanding: replica 1 gets work once replica 0 has some (one at a time, as
    # above, all four would go to replica 0). The exact split depends on when each request
    # arrives and finishes; test_replicas.py checks the policy step by step.
    for group, (r0, r1) in before.items():
        assert wait_for(lambda g=group, n=r0 + r1: sum(replica_requests(spread, g)) == n + 4), (group, replica_requests(spread, group))
        now = replica_requests(spread, group)
        assert now[0] > r0 and now[1] > r1, (group, before[group], now)


# ---- a routing plugin -------------------------------------------------------------------------
CHAT = {"model": "toy", "messages": [{"role": "user", "content": "route me"}], "temperature": 0, "max_tokens": 16}
SPEECH = {"model": "toy", "input": "route me", "response_format": "pcm", "seed": 3, "max_tokens": 16}


def test_plugin_routes_by_output_modality(modality):
    assert {n: e["replica"] for n, e in modality.health().json()["engines"].items()} == {"both/0": 0, "both/1": 1}
    before = replica_requests(modality, "both")
    for _ in range(3):
        assert httpx.post(f"{modality.url}/v1/audio/speech", json=SPEECH, timeout=60).status_code == 200
    for _ in range(2):
        assert httpx.post(f"{modality.url}/v1/chat/completions", json=CHAT, timeout=60).status_code == 200
    audio_chat = {**CHAT, "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}
    assert httpx.post(f"{modality.url}/v1/chat/completions", json=audio_chat, timeout=60).status_code == 200
    # audio out -> the last replica, text only -> the first (the default would put them all on 0)
    assert wait_for(lambda: replica_requests(modality, "both") == [before[0] + 2, before[1] + 4]), replica_requests(modality, "both")


def _sse_events(url: str, path: str, body: dict, events: list, started: threading.Event) -> None:
    try:
        with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True} if path.endswith("completions") else body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 3:
                        started.set()
    except httpx.HTTPError as exc:
        events.append(f"transport error: {exc}")
    started.set()


def test_killing_one_replica_fails_only_its_requests(modality):
    """Last on this server: a speech stream (replica 1) and a text stream (replica 0) run;
    replica 1 is killed; the speech request fails, the text one finishes with the output it
    gives alone; text keeps being served while replica 1 restarts; then speech works again."""
    long_chat = {**CHAT, "max_tokens": 480, "ignore_eos": True}
    alone = httpx.post(f"{modality.url}/v1/chat/completions", json=long_chat, timeout=120).json()["choices"][0]["message"]["content"]
    speech_alone = httpx.post(f"{modality.url}/v1/audio/speech", json=SPEECH, timeout=60).content
    long_speech = {**SPEECH, "max_tokens": 480, "ignore_eos": True, "stream_format": "sse"}

    speech_events: list = []
    text_events: list = []
    started = [threading.Event(), threading.Event()]
    threads = [
        threading.Thread(target=_sse_events, args=(modality.url, "/v1/audio/speech", long_speech, speech_events, started[0])),
        threading.Thread(target=_sse_events, args=(modality.url, "/v1/chat/completions", long_chat, text_events, started[1])),
    ]
    victim = modality.engine_pids()["both/1"]
    # Text first, then speech, then the kill at once: a 480-token toy stream can end within
    # a second, so the speech stream must not wait on the text stream's start.
    for t, ev in zip(reversed(threads), reversed(started), strict=True):
        t.start()
        assert ev.wait(60), modality.log_tail()
    os.kill(victim, signal.SIGKILL)
    # Reaped at once; its restart waits a back-off of 1 s: meanwhile the server is up.
    assert wait_for(lambda: not modality.health().json()["engines"]["both/1"]["alive"]), modality.log_tail()
    health = modality.health()
    assert health.status_code == 200 and health.json()["status"] == "replica_down", health.json()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a stream hung after a replica died"

    speech_last = json.loads(speech_events[-1])
    assert speech_last["type"] == "speech.audio.done" and speech_last["finish_reason"] == "error", speech_events[-3:]
    assert any(json.loads(e).get("type") == "error" for e in speech_events if e.startswith("{")), speech_events[-3:]
    assert text_events[-1] == "[DONE]", text_events[-3:]
    chunks = [json.loads(e) for e in text_events[:-1]]
    assert not any("error" in c for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")) == alone

    r = httpx.post(f"{modality.url}/v1/chat/completions", json=CHAT, timeout=60)
    assert r.status_code == 200, r.text  # text keeps running on replica 0
    # The supervisor restarts replica 1; then speech runs there again, byte-identical.
    assert wait_for(lambda: modality.health().json()["status"] == "ok", timeout=120), modality.log_tail()
    assert modality.engine_pids()["both/1"] != victim
    assert httpx.post(f"{modality.url}/v1/audio/speech", json=SPEECH, timeout=60).content == speech_alone
