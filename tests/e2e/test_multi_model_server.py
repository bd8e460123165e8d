"""Toy, Orpheus and Qwen3-TTS behind one ``mstar serve --models-config`` (tiny checkpoints):
requests go by their ``model`` field; concurrent requests to all three answer exactly what
single-model servers of each answer; ``/v1/models`` lists all with aliases; every metric
carries a ``model`` label; each model has its own admission limits; a killed engine of one
model leaves the others serving, and its supervised restart brings it back."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import ServerProcess
from websockets.sync.client import connect

pytestmark = pytest.mark.e2e

SERVED = ["chat", "orpheus", "qwen3tts"]  # the API names of toy, orpheus, qwen3tts
# Seeded requests: identical output whatever else the server runs at the time.
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "Hello there"}], "seed": 11, "temperature": 1.0, "max_tokens": 12}),
    ("/v1/chat/completions", {"model": "toy", "messages": [{"role": "user", "content": "Second one"}], "seed": 12, "temperature": 1.0, "max_tokens": 9}),
    ("/v1/audio/speech", {"model": "orpheus", "input": "Hi from Orpheus.", "voice": "leo", "seed": 3, "temperature": 0.8, "max_tokens": 40, "response_format": "pcm"}),
    ("/v1/audio/speech", {"model": "orpheus-tts", "input": "Another line.", "voice": "tara", "seed": 4, "temperature": 0.8, "max_tokens": 40, "response_format": "pcm"}),
    ("/v1/audio/speech", {"model": "qwen3tts", "input": "Hello from the server.", "voice": "ryan", "language": "english", "seed": 7, "max_tokens": 12, "response_format": "pcm"}),
    ("/v1/audio/speech", {"model": "qwen3-tts", "input": "And once more.", "voice": "dylan", "seed": 8, "max_tokens": 10, "response_format": "pcm"}),
]
PLUGIN_OF = {"chat": "toy", "toy": "toy", "orpheus": "orpheus", "orpheus-tts": "orpheus", "qwen3tts": "qwen3tts", "qwen3-tts": "qwen3tts"}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")  # a fresh random-weights cache, shared by every server here


@pytest.fixture(scope="module")
def orpheus_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_orpheus.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("orpheus-multi"), seed=5)


@pytest.fixture(scope="module")
def weights(toy_checkpoint: Path, orpheus_ckpt: Path) -> dict[str, list[str]]:
    """Each plugin's weights arguments, the same in the several-model server and the single ones."""
    return {"toy": ["--weights", str(toy_checkpoint)], "orpheus": ["--weights", str(orpheus_ckpt)], "qwen3tts": ["--random-weights"]}


def start(args: list[str], home: Path, log: Path) -> ServerProcess:
    srv = ServerProcess([*args, "--preprocess-workers", "0"], log, env={**os.environ, "HOME": str(home)})
    srv.start(timeout=400)
    return srv


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, home: Path, toy_checkpoint: Path, orpheus_ckpt: Path):
    config = tmp_path_factory.mktemp("config") / "models.yaml"
    config.write_text(
        "models:\n"
        f"  - model: toy\n    weights: {toy_checkpoint}\n    served_model_names: [chat, toy]\n    max_concurrency: 1\n    max_queue: 1\n"
        "    sampling: {temperature: 0, max_tokens: 5}\n"
        f"  - model: orpheus\n    weights: {orpheus_ckpt}\n"
        "  - model: qwen3tts\n    random_weights: true\n"
    )
    srv = start(["--models-config", str(config)], home, tmp_path_factory.mktemp("multi") / "server.log")
    try:
        yield srv
        assert srv.stop() == 0, srv.log_tail()
        srv.assert_clean_exit()
    finally:
        srv.kill_all()


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def post(http: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    """The part of a response that must not depend on the server: audio bytes, or the choices."""
    resp = http.post(path, json=body)
    assert resp.status_code == 200, (body["model"], resp.text)
    return resp.content if path == "/v1/audio/speech" else resp.json()["choices"]


def run_concurrently(http: httpx.Client) -> list[Any]:
    results: list[Any] = [None] * len(REQUESTS)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(REQUESTS))

    def one(i: int) -> None:
        try:
            barrier.wait(30)
            results[i] = post(http, *REQUESTS[i])
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return results


@pytest.fixture(scope="module")
def concurrent(http: httpx.Client) -> list[Any]:
    """The answers of the several-model server to ``REQUESTS``, sent all at once."""
    return run_concurrently(http)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, home: Path, weights: dict[str, list[str]]) -> list[Any]:
    """The answers of a single-model server of each plugin to ``REQUESTS`` (one at a time)."""
    out: list[Any] = [None] * len(REQUESTS)
    for plugin in ("toy", "orpheus", "qwen3tts"):
        names = ["--served-model-name", "chat", "--served-model-name", "toy"] if plugin == "toy" else []
        srv = start(["--model", plugin, *weights[plugin], *names], home, tmp_path_factory.mktemp(f"single-{plugin}") / "server.log")
        try:
            with httpx.Client(base_url=srv.url, timeout=120) as c:
                for i, (path, body) in enumerate(REQUESTS):
                    if PLUGIN_OF[body["model"]] == plugin:
                        out[i] = post(c, path, body)
            assert srv.stop() == 0, srv.log_tail()
        finally:
            srv.kill_all()
    return out


def test_models_lists_every_model_with_aliases(server: ServerProcess, http: httpx.Client) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == SERVED
    cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert cards["chat"]["aliases"] == ["toy"]
    assert cards["orpheus"]["aliases"] == ["orpheus-3b", "orpheus-tts"]
    assert cards["qwen3tts"]["aliases"] == ["qwen3-tts", "qwen3-tts-customvoice"]
    assert "speech" in cards["qwen3tts"]["endpoints"] and "chat" not in cards["qwen3tts"]["endpoints"]
    assert http.get("/v1/models/orpheus-tts").json()["id"] == "orpheus"
    assert [m["model"] for m in http.get("/version").json()["models"]] == SERVED
    health = http.get("/health").json()
    assert health["status"] == "ok" and list(health["models"]) == SERVED
    # The ready line names every model, then one line each (placement, KV capacity).
    log = server.log_path.read_text(errors="replace").splitlines()
    at = next(i for i, line in enumerate(log) if line.startswith("mstar serve ready:"))
    assert log[at] == f"mstar serve ready: 3 models chat, orpheus, qwen3tts | {server.url}", log[at]
    for line, name in zip(log[at + 1:at + 4], SERVED, strict=True):
        assert line.startswith(f"  model {name} ") and "placement 0:" in line and "KV capacity" in line, line


def test_unknown_model_is_a_404_listing_the_served_names(http: httpx.Client) -> None:
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}), ("/v1/audio/speech", {"input": "x"})):
        resp = http.post(path, json={"model": "nope", **body})
        assert resp.status_code == 404, resp.text
        err = resp.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        for name in [*SERVED, "toy", "orpheus-tts", "qwen3-tts"]:
            assert repr(name) in err["message"]
    assert http.get("/v1/models/nope").status_code == 404
    assert http.get("/health", params={"model": "nope"}).status_code == 404


def test_concurrent_requests_equal_single_model_servers(concurrent: list[Any], single: list[Any]) -> None:
    for (path, body), got, want in zip(REQUESTS, concurrent, single, strict=True):
        assert want, f"{body['model']}: the reference answered nothing"  # no empty == empty
        assert got == want, f"{body['model']} {path}: differs from its single-model server"


def test_every_metric_carries_the_model_label(server: ServerProcess, concurrent: list[Any]) -> None:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    samples = [line for line in text.splitlines() if line.startswith("mstar_")]
    assert samples and all('model="' in line for line in samples), [s for s in samples if 'model="' not in s][:3]
    for model in SERVED:
        assert server.metric("mstar_engine_up", model=model) == 1
        assert server.metric("mstar_kv_blocks_total", model=model) > 0
    assert server.metric("mstar_requests_total", model="chat", endpoint="/v1/chat/completions", status="200") >= 2
    assert server.metric("mstar_requests_total", model="orpheus", endpoint="/v1/audio/speech", status="200") >= 2
    assert server.metric("mstar_requests_total", model="qwen3tts", endpoint="/v1/audio/speech", status="200") >= 2
    assert server.metric("mstar_time_to_first_audio_seconds_count", model="qwen3tts") >= 2
    assert server.metric("mstar_time_to_first_token_seconds_count", model="chat") >= 2
    assert server.metric("mstar_time_to_first_token_seconds_count", model="orpheus") == 0  # speech only


def test_each_model_has_its_own_admission(http: httpx.Client, concurrent: list[Any]) -> None:
    # toy: max_concurrency 1, max_queue 1 in the YAML. Six long toy requests at once: one
    # runs, one waits, the rest get 429; Qwen3-TTS requests sent with them are not limited.
    long = {**REQUESTS[0][1], "max_tokens": 400, "ignore_eos": True}
    jobs = [("/v1/chat/completions", long)] * 6 + [REQUESTS[4]] * 3
    answers: list[httpx.Response | None] = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def one(i: int) -> None:
        barrier.wait(30)
        answers[i] = http.post(jobs[i][0], json=jobs[i][1])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    toy, tts = answers[:6], answers[6:]
    assert all(r is not None for r in answers)
    codes = sorted(r.status_code for r in toy)
    assert codes.count(200) >= 1 and codes.count(429) >= 2, codes
    assert all(r.json()["error"]["code"] == "queue_full" for r in toy if r.status_code == 429)
    assert len({json.dumps(r.json()["choices"]) for r in toy if r.status_code == 200}) == 1  # seeded
    assert [r.status_code for r in tts] == [200] * 3 and all(r.content == concurrent[4] for r in tts)


def test_sampling_defaults_from_the_models_file(http: httpx.Client) -> None:
    # toy's entry: sampling {temperature: 0, max_tokens: 5}. Unseeded requests without
    # their own values are greedy and 5 tokens long; a request's own values win.
    body = {"model": "chat", "messages": [{"role": "user", "content": "Defaults, please"}]}
    first, again = http.post("/v1/chat/completions", json=body).json(), http.post("/v1/chat/completions", json=body).json()
    assert first["usage"]["completion_tokens"] == 5 and first["choices"][0]["finish_reason"] == "length", first
    assert first["choices"] == again["choices"] and first["seed"] != again["seed"]  # greedy: the seed does not matter
    own = http.post("/v1/chat/completions", json={**body, "max_tokens": 3}).json()
    assert own["usage"]["completion_tokens"] == 3


def test_ws_speech_routes_by_model(server: ServerProcess, concurrent: list[Any]) -> None:
    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    body = REQUESTS[4][1]
    settings = {k: body[k] for k in ("voice", "language", "seed", "max_tokens")}
    # The first session message picks the model (the first that speaks, toy, otherwise).
    with connect(url, proxy=None, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session", "model": "qwen3-tts", **settings}))
        ws.send(json.dumps({"type": "text", "text": body["input"]}))
        ws.send(json.dumps({"type": "flush"}))
        pcm, frames = b"", []
        while not frames or frames[-1].get("type") != "flushed":
            frame = ws.recv(timeout=60)
            if isinstance(frame, bytes):
                pcm += frame
            else:
                frames.append(json.loads(frame))
        assert [f["type"] for f in frames] == ["start", "end", "flushed"], frames
        assert pcm == concurrent[4]
        # One socket speaks one model: no switching after the first sentence.
        ws.send(json.dumps({"type": "session", "model": "orpheus"}))
        assert json.loads(ws.recv(timeout=30))["error"]["param"] == "model"
    with connect(url + "?model=nope", proxy=None, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "model_not_found"


def test_killed_engine_of_one_model_leaves_the_others_serving(server: ServerProcess, http: httpx.Client, concurrent: list[Any]) -> None:
    orpheus_pid = http.get("/health", params={"model": "orpheus"}).json()["engines"]["0"]["pid"]
    os.kill(orpheus_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and http.get("/health").status_code == 200:
        time.sleep(0.05)
    health = http.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded", health.text
    assert health.json()["models"]["orpheus"]["status"] in ("restarting", "unhealthy")
    assert http.get("/health", params={"model": "qwen3tts"}).status_code == 200
    # The others answer as before, byte for byte; Orpheus answers 503 until it is back.
    assert post(http, *REQUESTS[0]) == concurrent[0]
    assert post(http, *REQUESTS[5]) == concurrent[5]
    down = http.post(REQUESTS[2][0], json=REQUESTS[2][1])
    assert down.status_code == 503 and down.headers.get("retry-after"), down.text
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and http.get("/health", params={"model": "orpheus"}).status_code != 200:
        time.sleep(0.2)
    assert http.get("/health").json()["models"]["orpheus"]["engines"]["0"]["restarts"] == 1
    assert post(http, *REQUESTS[2]) == concurrent[2]
    assert server.metric("mstar_engine_up", model="orpheus") == 1
