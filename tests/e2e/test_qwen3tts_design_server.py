"""``mstar serve --model qwen3tts-voicedesign --random-weights`` (a tiny random VoiceDesign
checkpoint) on loopback: the voice described by ``instructions`` through the ``openai``
client (seeded bytes repeat; the instruction changes the audio), streamed pcm == whole, and
400s naming the field for what VoiceDesign does not take."""

from __future__ import annotations

import io

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import ServerProcess

pytestmark = pytest.mark.e2e

SAMPLES_PER_FRAME = 48  # the tiny random checkpoint's codec
MODEL = "qwen3tts-voicedesign"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("home")  # a fresh random-weights cache
    srv = ServerProcess(["--model", MODEL, "--random-weights", "--preprocess-workers", "1"],
                        tmp_path_factory.mktemp("log") / "server.log")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        srv.start()
    yield srv
    try:
        assert srv.stop() == 0, srv.log_tail()
    finally:
        srv.kill_all()


def test_instructions_design_the_voice(server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def speak(instructions: str) -> bytes:
        # The openai client requires a voice; VoiceDesign takes an empty one.
        return client.audio.speech.create(model=MODEL, voice="", input="Hello from a designed voice.", response_format="wav",
                                          instructions=instructions,
                                          extra_body={"language": "english", "seed": 7, "max_tokens": 10, "min_tokens": 10}).content

    warm = speak("A warm, low voice.")
    wav, sr = sf.read(io.BytesIO(warm), dtype="float32")
    assert sr == 24000 and len(wav) == 10 * SAMPLES_PER_FRAME and np.abs(wav).max() > 0
    assert speak("A warm, low voice.") == warm  # seeded: byte-identical
    assert speak("Bright and fast.") != warm  # the instruction is in the prompt


def test_streamed_pcm_equals_whole(server) -> None:
    body = {"model": MODEL, "input": "Streaming a designed voice, chunk by chunk.", "instructions": "Calm.", "seed": 3,
            "max_tokens": 20, "min_tokens": 20, "response_format": "pcm", "non_streaming_mode": False}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        whole = http.post("/v1/audio/speech", json=body)
        assert whole.status_code == 200, whole.text
        with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio"}) as resp:
            assert resp.status_code == 200
            chunks = [c for c in resp.iter_bytes() if c]
    assert len(chunks) > 1 and b"".join(chunks) == whole.content
    assert len(whole.content) == 20 * SAMPLES_PER_FRAME * 2  # pcm16


@pytest.mark.parametrize(("extra", "param"), [({"voice": "ryan"}, "voice"), ({"ref_audio": "abc"}, "ref_audio"),
                                              ({"language": "klingon"}, "language")])
def test_what_voice_design_does_not_take_is_a_400(server, extra, param) -> None:
    resp = httpx.post(f"{server.url}/v1/audio/speech", json={"model": MODEL, "input": "Hi", "instructions": "Calm.", **extra},
                      timeout=60)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
