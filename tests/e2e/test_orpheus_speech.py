"""Orpheus behind a real ``mstar serve``: /v1/audio/speech returns the reference audio
(transformers generate + the official decoding rule + snac), streams it while the LM
decodes, reproduces seeded requests under load, and answers bad requests with 4xx."""

from __future__ import annotations

import importlib.util
import io
import json
import threading
import time
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import torch

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
GREEDY = {"temperature": 0, "repetition_penalty": 1.3, "max_tokens": 64}


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _load("orpheus_e2e_reference", HERE.parent / "orpheus" / "orpheus_reference.py")
ServerProcess = _load("orpheus_e2e_server", HERE / "conftest.py").ServerProcess


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from mstar_orpheus.checkpoint import write_checkpoint

    # A noise-free SNAC so that the audio is comparable with snac's, sample for sample.
    return write_checkpoint(tmp_path_factory.mktemp("orpheus-e2e"), seed=5, snac={"noise": False})


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    srv = ServerProcess(["--model", "orpheus", "--weights", str(ckpt), "--preprocess-workers", "1"],
                        tmp_path_factory.mktemp("orpheus-server") / "server.log")
    try:
        srv.start()
        yield srv
        assert srv.stop() == 0, srv.log_tail()
        srv.assert_clean_exit()
    finally:
        srv.kill_all()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _speech(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/speech", json={"model": "orpheus", **body}, timeout=120)


def test_speech_equals_the_official_pipeline(client, ckpt):
    text, voice = "Hello from the server.", "leo"
    resp = client.audio.speech.create(model="orpheus", input=text, voice=voice, response_format="wav", extra_body=GREEDY)
    audio, rate = sf.read(io.BytesIO(resp.content), dtype="int16")
    assert rate == 24000
    prompt = ref.official_prompt(ckpt, text, voice)
    tokens = ref.hf_greedy(ckpt, prompt, GREEDY["max_tokens"], repetition_penalty=GREEDY["repetition_penalty"])
    expected = ref.official_stream_audio(ckpt, tokens)
    assert len(expected) >= 4 * 2048 and audio.shape == expected.shape
    assert int(np.abs(audio.astype(np.int32) - expected.astype(np.int32)).max()) <= 1


def test_pcm_streams_before_generation_ends_and_equals_the_whole(server):
    body = {"input": "A longer sentence that streams out in many chunks.", "voice": "tara", "seed": 21,
            "max_tokens": 140, "response_format": "pcm"}
    whole = _speech(server, body).content
    start = time.monotonic()
    arrivals, parts = [], []
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json={"model": "orpheus", **body, "stream_format": "audio"},
                      timeout=120) as r:
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            arrivals.append(time.monotonic() - start)
            parts.append(chunk)
    assert b"".join(parts) == whole and len(whole) == 17 * 2048 * 2  # windows at 28, 35, ..., 140 codes
    assert len(parts) > 2 and arrivals[0] < 0.6 * arrivals[-1]
    events = []
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json={"model": "orpheus", **body, "stream_format": "sse"},
                      timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["finish_reason"] == "length"
    import base64

    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == whole


def test_seeded_wav_identical_over_repeats_and_beside_eight_others(server):
    seeded = {"input": "Always the same words.", "voice": "zoe", "seed": 99, "max_tokens": 56}
    first = _speech(server, seeded).content
    assert first[:4] == b"RIFF" and len(first) > 44 + 2048 * 2
    assert _speech(server, seeded).content == first
    results: dict[int, bytes] = {}

    def other(i: int) -> None:
        results[i] = _speech(server, {"input": f"Background request {i}.", "voice": "mia", "max_tokens": 40 + 4 * i}).content

    threads = [threading.Thread(target=other, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    crowded = _speech(server, seeded).content
    for t in threads:
        t.join()
    assert crowded == first
    assert len(results) == 8 and all(r[:4] == b"RIFF" for r in results.values())


@pytest.mark.parametrize("body,param,words", [
    ({"input": "Hi", "voice": "alloy"}, "voice", ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"]),
    ({"input": ""}, "input", []),
    ({"input": "   "}, "input", ["empty"]),
    ({"input": "word " * 400}, "input", ["at most 1024 positions"]),
    ({"input": "Hi", "speed": 1.5}, "speed", ["speed"]),
    ({"input": "Hi", "temperature": -1}, "temperature", []),
])
def test_bad_requests_are_4xx_naming_the_field(server, body, param, words):
    resp = _speech(server, body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and all(w in err["message"] for w in words), err


def test_generate_returns_tokens_and_audio_of_the_in_process_engine(server, ckpt):
    from mstar import Engine
    from mstar.api.tensors import tensor_from_json

    prompt = ref.official_prompt(ckpt, "Native inputs.", "dan")
    sampling = {"seed": 8, "max_tokens": 40}
    out = httpx.post(f"{server.url}/v1/generate", json={"model": "orpheus", "inputs": {"prompt_ids": prompt}, "sampling": sampling},
                     timeout=120).json()
    with Engine.from_model("orpheus", weights=ckpt) as engine:
        local = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor(prompt)}, "sampling": sampling}])[0]
    assert torch.equal(tensor_from_json(out["outputs"]["token"], "token"), local.cat("token"))
    assert torch.equal(tensor_from_json(out["outputs"]["audio"], "audio"), local.cat("audio"))
