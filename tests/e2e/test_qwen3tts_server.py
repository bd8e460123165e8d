"""``mstar serve --model qwen3tts --random-weights`` on loopback, driven by the official
``openai`` client and httpx: speech (whole and streamed), native generate with per-label
sampling, and the 400s for unknown labels and unimplemented features."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

pytestmark = pytest.mark.e2e

SAMPLES_PER_FRAME = 48  # the tiny random checkpoint's codec


def _server_process_class():
    # The e2e conftest's ServerProcess, loaded by path (conftest modules share one name).
    spec = importlib.util.spec_from_file_location("e2e_server_process", Path(__file__).with_name("conftest.py"))
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("home")  # a fresh random-weights cache
    srv = _server_process_class()(
        ["--model", "qwen3tts", "--random-weights", "--preprocess-workers", "1"], tmp_path_factory.mktemp("log") / "server.log"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        srv.start()
    yield srv
    try:
        assert srv.stop() == 0, srv.log_tail()
    finally:
        srv.kill_all()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


SPEECH = {"voice": "ryan", "input": "Hello from the server.", "extra_body": {"language": "english", "seed": 7, "max_tokens": 12}}


def test_speech_wav(client) -> None:
    audio = client.audio.speech.create(model="qwen3tts", response_format="wav", **SPEECH).content
    wav, sr = sf.read(io.BytesIO(audio), dtype="float32")
    assert sr == 24000 and 0 < len(wav) <= 12 * SAMPLES_PER_FRAME and len(wav) % SAMPLES_PER_FRAME == 0
    assert np.abs(wav).max() > 0
    again = client.audio.speech.create(model="qwen3tts", response_format="wav", **SPEECH).content
    assert again == audio  # seeded: byte-identical


def test_streamed_pcm_equals_whole(http) -> None:
    body = {"model": "qwen3tts", "voice": "dylan", "input": "Streaming, chunk by chunk.", "seed": 3,
            "max_tokens": 20, "min_tokens": 20, "response_format": "pcm", "non_streaming_mode": False}
    whole = http.post("/v1/audio/speech", json=body)
    assert whole.status_code == 200, whole.text
    chunks = []
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio"}) as resp:
        assert resp.status_code == 200
        chunks = [c for c in resp.iter_bytes() if c]
    assert b"".join(chunks) == whole.content
    assert len(whole.content) == 20 * SAMPLES_PER_FRAME * 2  # pcm16


def test_aux_sampling_reaches_the_code_predictor(http) -> None:
    base = {"model": "qwen3tts", "voice": "vivian", "input": "Same first codes?", "seed": 11, "temperature": 0,
            "max_tokens": 8, "min_tokens": 8, "response_format": "pcm"}
    greedy = http.post("/v1/audio/speech", json={**base, "sampling": {"aux": {"code_predictor": {"temperature": 0}}}})
    hot = http.post("/v1/audio/speech", json={**base, "sampling": {"aux": {"code_predictor": {"temperature": 1.5, "top_k": 0}}}})
    assert greedy.status_code == hot.status_code == 200
    assert greedy.content != hot.content


def test_native_generate_with_per_label_sampling(http, tmp_path: Path) -> None:
    from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
    from mstar_qwen3tts.prompt import assistant_text, build_prompt
    from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer
    from mstar_qwen3tts.tiny_checkpoint import write_checkpoint

    ckpt = write_checkpoint(tmp_path)  # the same tokenizer and ids as the served random checkpoint
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
    prompt = build_prompt(cfg, encode(load_tokenizer(ckpt), assistant_text("Native inputs.")), "ryan")
    inputs = {k: v.tolist() for k, v in prompt.inputs().items()}
    sampling = {"talker": {"main": {"temperature": 0, "max_tokens": 6, "min_tokens": 6},
                           "aux": {"code_predictor": {"temperature": 0}}}}
    resp = http.post("/v1/generate", json={"model": "qwen3tts", "inputs": inputs, "sampling": sampling})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["outputs"]["codes"]["shape"] == [6, 4]
    assert body["outputs"]["audio"]["shape"] == [6 * SAMPLES_PER_FRAME]
    bad = {"talker": {"main": {"temperature": 0}, "aux": {"residual": {"temperature": 0.5}}}}
    resp = http.post("/v1/generate", json={"model": "qwen3tts", "inputs": inputs, "sampling": bad})
    assert resp.status_code == 400 and "residual" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"sampling": {"aux": {"residual": {"temperature": 0.5}}}}, "sampling.aux"),
        ({"instructions": "speak softly"}, "instructions"),
        ({"ref_audio": "clip.wav"}, "ref_audio"),
        ({"voice": "alloy"}, "voice"),
        ({"language": "klingon"}, "language"),
    ],
)
def test_bad_speech_requests_are_400(http, extra, param) -> None:
    resp = http.post("/v1/audio/speech", json={"model": "qwen3tts", "input": "Hi", "voice": "ryan", **extra})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
