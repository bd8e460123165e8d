"""Chat with audio out in a saved voice, over HTTP on a toy server (a model that makes voices
and speaks in chat): ``audio.voice`` may name a saved voice, as ``voice`` does in
``/v1/audio/speech``. The toy's voice puts its prefix before the chat transcript, so the
spoken answer equals the speech of that transcript in the same voice."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import ServerProcess

pytestmark = pytest.mark.e2e

RATE = 16000
TRANSCRIPT = "user: Hi.\nassistant:"  # the toy's chat prompt for one user message "Hi."


def clip(loudness: tuple[float, ...] = (0.1, 0.5, 0.9, 0.3)) -> bytes:
    n = RATE // 4
    sign = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    buf = io.BytesIO()
    sf.write(buf, np.concatenate([a * sign for a in loudness]).astype(np.float32), RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(start_server: Any, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    voices: Path = tmp_path_factory.mktemp("voices")
    return start_server(["--voices-dir", str(voices)])


def chat(server: ServerProcess, voice: str) -> Any:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    return client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "Hi."}], modalities=["text", "audio"],
        audio={"voice": voice, "format": "pcm16"}, max_tokens=10, seed=11, temperature=1.0,
    )


def speech(server: ServerProcess, text: str, voice: str) -> bytes:
    body = {"model": "toy", "input": text, "voice": voice, "response_format": "pcm", "seed": 11, "max_tokens": 10, "temperature": 1.0}
    resp = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.content


def test_chat_audio_speaks_a_saved_voice(server: ServerProcess) -> None:
    made = httpx.post(f"{server.url}/v1/audio/voices", data={"name": "narrator"},
                      files={"audio": ("ref.wav", clip(), "audio/wav")}, timeout=60)
    assert made.status_code == 201, made.text
    spoken = chat(server, "narrator").choices[0].message.audio
    plain = chat(server, "alloy").choices[0].message.audio
    assert spoken is not None and plain is not None
    audio = base64.b64decode(spoken.data)
    assert audio == speech(server, TRANSCRIPT, "narrator")  # the voice's prefix reached the chat prompt
    assert audio != base64.b64decode(plain.data)
    assert base64.b64decode(plain.data) == speech(server, TRANSCRIPT, "alloy")
    # A name that is neither built in nor saved is still refused, naming the field.
    with pytest.raises(openai.BadRequestError) as err:
        chat(server, "nobody")
    assert err.value.body["param"] == "audio.voice" and "alloy" in err.value.body["message"]
